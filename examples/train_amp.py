"""A small image classifier trained with Apex amp, in the style of NVIDIA's ImageNet example.

Try it: `ampmigrate examples/` prints the diff that moves it to torch.amp, and
`ampmigrate examples/ --write` applies it. Runs on synthetic data; the Apex version
needs a CUDA build of apex, the migrated one only torch.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from apex import amp


def parse_args():
    parser = argparse.ArgumentParser(description="Apex amp training example")
    parser.add_argument(
        "--opt-level", default="O1", help="Apex optimization level: O0, O1, O2 or O3"
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--clip-grad", type=float, default=5.0)
    return parser.parse_args()


class TinyResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.block = nn.Sequential(
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)
        )
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = F.relu(x + self.block(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def batches(num_batches=20, batch_size=32):
    generator = torch.Generator().manual_seed(0)
    for _ in range(num_batches):
        images = torch.randn(batch_size, 3, 16, 16, generator=generator)
        labels = torch.randint(0, 10, (batch_size,), generator=generator)
        yield images, labels


def train_epoch(model, optimizer, clip_grad):
    model.train()
    for images, labels in batches():
        images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
        output = model(images)
        loss = F.cross_entropy(output, labels)

        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), clip_grad)
        optimizer.step()
    return loss.item()


def main():
    args = parse_args()
    model = TinyResNet().cuda()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4
    )
    model, optimizer = amp.initialize(
        model, optimizer, opt_level=args.opt_level, loss_scale="dynamic"
    )

    for epoch in range(args.epochs):
        loss = train_epoch(model, optimizer, args.clip_grad)
        print(f"epoch {epoch}: loss {loss:.4f}")

    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "amp": amp.state_dict(),
        },
        "checkpoint.pt",
    )


if __name__ == "__main__":
    main()
