"""torchvision's ResNet-18 trained for a few SGD-with-momentum steps on random images:
plain PyTorch. Its *_tensordd.py twin differs in the device line only.

    python3 resnet18.py [RESULTS.pt]      # RESULTS.pt: the losses and the final weights
"""
import sys

import torch
import torch.nn.functional as F
import torchvision

import tensordd.torch; device = tensordd.torch.device()  # noqa: E401,E702

torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images = torch.randn(8, 3, 64, 64)
labels = torch.randint(0, 10, (8,))

losses = []
for step in range(3):
    opt.zero_grad()
    out = model(images.to(device))
    loss = F.cross_entropy(out, labels.to(device))
    loss.backward()
    opt.step()
    losses.append(loss.item())
    print(f"step {step}: loss {loss.item():.6f}")

if len(sys.argv) > 1:
    torch.save({"losses": losses, "state": {k: v.cpu() for k, v in model.state_dict().items()}},
               sys.argv[1])
