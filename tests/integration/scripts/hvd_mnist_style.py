"""A script written the way Horovod's examples/pytorch/pytorch_mnist.py is, with one change: it
imports ``cloudtrain.runtime.hvd as hvd`` where Horovod's imports ``horovod.torch as hvd``. The
digits set stands in for MNIST (no network on the nodes)."""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from sklearn.datasets import load_digits
from torch import nn
from torch.optim.lr_scheduler import StepLR

import cloudtrain.runtime.hvd as hvd

parser = argparse.ArgumentParser(description="PyTorch digits example, the Horovod way")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--fp16-allreduce", action="store_true", default=False)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def metric_average(val: float, name: str) -> float:
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return float(avg_tensor.item())


def main() -> None:
    args = parser.parse_args()
    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    train_dataset = torch.utils.data.TensorDataset(x[:1400], y[:1400])
    test_dataset = torch.utils.data.TensorDataset(x[1400:], y[1400:])
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler
    )
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank()
    )
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=100, sampler=test_sampler)

    model = Net()
    lr_scaler = hvd.size()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=compression,
        op=hvd.Average,
    )
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
        scheduler.step()
        model.eval()
        test_loss, test_accuracy = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                pred = output.argmax(1)
                test_accuracy += float(pred.eq(target).float().sum())
        test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
        test_accuracy = metric_average(test_accuracy / len(test_sampler), "avg_accuracy")
        if hvd.rank() == 0:
            print(
                f"epoch {epoch} lr {scheduler.get_last_lr()[0]:.4f} loss {test_loss:.4f} "
                f"accuracy {test_accuracy:.4f}",
                flush=True,
            )
    hvd.join()
    if hvd.rank() == 0:
        print(f"world of {hvd.size()}: done", flush=True)


if __name__ == "__main__":
    main()
