"""accumcore: a PyTorch trainer with exact gradient accumulation.

    from accumcore import Trainer, Callback, CheckpointInfo, save_checkpoint, load_checkpoint
    trainer = Trainer(model, optimizer, loss_fn=torch.nn.CrossEntropyLoss(), accumulation_steps=4)
    history = trainer.fit(train_loader, epochs=2, val_loader=val_loader)

The trainer library only: it imports torch, and nothing of the service (`services`).
"""

from accumcore.activation_checkpointing import checkpoint_activations
from accumcore.callbacks import Callback, CheckpointInfo
from accumcore.checkpoint import save_checkpoint
from accumcore.restore import load_checkpoint
from accumcore.sharded_checkpoint import consolidate as consolidate_checkpoint
from accumcore.sharding import shard
from accumcore.trainer import FitHistory, NonFiniteError, Trainer
from accumcore.verify_window import ExactnessError

__all__ = [
    "Callback", "CheckpointInfo", "ExactnessError", "FitHistory", "NonFiniteError", "Trainer",
    "checkpoint_activations", "consolidate_checkpoint", "load_checkpoint", "save_checkpoint", "shard",
]
