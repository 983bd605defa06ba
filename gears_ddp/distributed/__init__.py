"""Distributed training: process groups, launch environments, checkpoints and the DDP worker."""
