"""PyTorch's MNIST example, shrunk to run in seconds on scikit-learn's 8x8 digits
(upsampled to 16x16): a DataLoader over a TensorDataset, Conv2d, dropout, log_softmax,
nll_loss, Adadelta, StepLR, torch.save(model.state_dict()) and a reload. Plain PyTorch;
its *_tensordd.py twin differs in the device line only.

    python3 mnist.py [RESULTS.pt]   # RESULTS.pt: the losses and the accuracies
"""
import os
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

import tensordd.torch; device = tensordd.torch.device()  # noqa: E401,E702


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(32 * 6 * 6, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def train(model, loader, optimizer, epoch, losses):
    model.train()
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(f"epoch {epoch}: last loss {losses[-1]:.6f}")


def test(model, loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    n = len(loader.dataset)
    print(f"test: average loss {test_loss / n:.4f}, accuracy {correct}/{n}")
    return test_loss / n, correct / n


torch.manual_seed(1)
digits = load_digits()
images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
images = F.interpolate(images, size=(16, 16), mode="bilinear", align_corners=False)
images = (images - 0.1307) / 0.3081
labels = torch.tensor(digits.target, dtype=torch.int64)
train_set = TensorDataset(images[:1200], labels[:1200])
test_set = TensorDataset(images[1200:], labels[1200:])
train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
test_loader = DataLoader(test_set, batch_size=200)

model = Net().to(device)
optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
losses, results = [], []
for epoch in range(1, 4):
    train(model, train_loader, optimizer, epoch, losses)
    results.append(test(model, test_loader))
    scheduler.step()

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "mnist_cnn.pt")
    torch.save(model.state_dict(), path)
    reloaded = Net().to(device)
    reloaded.load_state_dict(torch.load(path))
    results.append(test(reloaded, test_loader))

if len(sys.argv) > 1:
    torch.save({"losses": losses, "results": results}, sys.argv[1])
