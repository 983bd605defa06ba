"""The settings every training benchmark shares, so that the figures of one script compare
with another's: the published GEARS's defaults (hidden size, learning rate, weight decay,
batch size) and the split of the synthetic data."""

HIDDEN_SIZE = 64
LR = 1e-3
WEIGHT_DECAY = 5e-4
BATCH_SIZE = 32
SPLIT = {"split": "simulation", "seed": 1}
# the test subgroups of the simulation split, as both packages name them
SUBGROUPS = ("combo_seen0", "combo_seen1", "combo_seen2", "unseen_single")
