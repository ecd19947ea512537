"""A tiny Hugging Face Accelerate training loop: a linear model fitted to y = sum(x), gloo on CPU, NCCL on GPUs.
Every rank prints its index and the loss; rank 0 saves the model into GTRAIN_CHECKPOINT_DIR."""

import argparse
import os

import torch
from accelerate import Accelerator

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--lr", type=float, default=0.05)
args = ap.parse_args()

acc = Accelerator(cpu=not torch.cuda.is_available())
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
model, opt = acc.prepare(model, opt)
gen = torch.Generator().manual_seed(acc.process_index)
for step in range(args.steps):
    x = torch.randn(16, 8, generator=gen).to(acc.device)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
world = acc.reduce(torch.ones(1, device=acc.device), reduction="sum").item()
print(f"accelerate rank {acc.process_index}/{acc.num_processes} world {int(world)} "
      f"type {acc.distributed_type.value} loss {loss.item():.4f}", flush=True)
acc.wait_for_everyone()
if acc.is_main_process:
    ckpt = os.environ.get("GTRAIN_CHECKPOINT_DIR", "checkpoints")
    os.makedirs(ckpt, exist_ok=True)
    torch.save(acc.unwrap_model(model).state_dict(), os.path.join(ckpt, "model.pt"))
