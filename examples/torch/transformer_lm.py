"""A small language model (an embedding, nn.TransformerEncoder, a linear head)
trained for a few AdamW steps on random tokens: plain PyTorch. Its *_tensordd.py twin
differs in the device line only.

    python3 transformer_lm.py [RESULTS.pt]   # RESULTS.pt: the losses and the final weights
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cpu")

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 50, 32, 4, 2, 12, 4


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        layer = nn.TransformerEncoderLayer(DIM, HEADS, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


torch.manual_seed(0)
model = LM().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))

losses = []
for step in range(3):
    opt.zero_grad()
    inputs, targets = tokens[:, :-1].to(device), tokens[:, 1:].to(device)
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(loss.item())
    print(f"step {step}: loss {loss.item():.6f}")

if len(sys.argv) > 1:
    torch.save({"losses": losses, "state": {k: v.cpu() for k, v in model.state_dict().items()}},
               sys.argv[1])
