#!/usr/bin/env bash
# Train GEARS with DDP on two machines with torchrun: run this on both, with the same
# MASTER_ADDR (an address of node 0 that node 1 can reach) and NODE_RANK 0 and 1.
#
#     bash examples/torchrun_two_nodes.sh NODE_RANK MASTER_ADDR [GPUS_PER_NODE]
#
#     node 0:  bash examples/torchrun_two_nodes.sh 0 10.0.0.1 4
#     node 1:  bash examples/torchrun_two_nodes.sh 1 10.0.0.1 4
#
# GPUS_PER_NODE defaults to the GPUs torch sees (1 process on a machine without GPUs, which
# then trains on CPU with gloo). Environment overrides: DATA_PATH (./data), DATASET (norman,
# or a folder under DATA_PATH such as the synthetic one), SAVE_PATH, ARGS (the training
# options, docs/options.md, as a YAML mapping; SAVE_PATH and the checkpoints a restart
# continues from are set after it, unless ARGS gives them). DATA_PATH must hold the same dataset files on
# both machines: a shared filesystem, or a copy on each (file times may differ: the ranks
# compare the data by content, and name the ranks whose data differ). Both machines need the
# same gears_ddp version, and node 1 must reach MASTER_ADDR:29500. Rank 0 (node 0) writes the
# model. The processes of a node prepare the data once between them (expression map, split
# file, graphs; a published dataset is downloaded once): the first builds, the others wait.
#
# One machine needs no second node and no address:
#
#     torchrun --standalone --nproc_per_node=4 -m gears_ddp train --config run.yaml
#
# (or, simpler and sharing one copy of the data between the processes,
# examples/train_ddp_example.py / gears_ddp.train_multi_gpu).
set -euo pipefail

usage="usage: bash $0 NODE_RANK MASTER_ADDR [GPUS_PER_NODE]   (NODE_RANK: 0 on the master node, 1 on the other)"
if [[ $# -lt 2 || $# -gt 3 ]]; then
    echo "$usage" >&2
    exit 2
fi
NODE_RANK=$1
MASTER_ADDR=$2
GPUS=${3:-$(python -c "import torch; print(max(torch.cuda.device_count(), 1))")}
if [[ ! $NODE_RANK =~ ^[01]$ ]]; then
    echo "NODE_RANK must be 0 or 1, got '$NODE_RANK'; $usage" >&2
    exit 2
fi
if [[ ! $GPUS =~ ^[1-9][0-9]*$ ]]; then
    echo "GPUS_PER_NODE must be a positive integer, got '$GPUS'; $usage" >&2
    exit 2
fi

DATA_PATH=${DATA_PATH:-./data}
DATASET=${DATASET:-norman}
SAVE_PATH=${SAVE_PATH:-./runs/${DATASET}_torchrun}
ARGS=${ARGS:-"{epochs: 20, batch_size: 32, lr_scaling: sqrt}"}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # CPU ranks: OpenMP threads sleep while they wait

# The run's configuration, written on each node, which gears-ddp train --config reads.
mkdir -p "$(dirname "$SAVE_PATH")"
CONFIG="$SAVE_PATH.node$NODE_RANK.yaml"
cat > "$CONFIG" <<EOF
pert_data_path: $DATA_PATH
dataset_name: $DATASET
split_config: {split: simulation, seed: 1, train_gene_set_size: 0.75}
args: $ARGS
EOF

# 2 nodes x GPUS processes; torchrun gives each its RANK, WORLD_SIZE, LOCAL_RANK and the
# rendezvous address, which gears-ddp train reads (one GPU per local rank). If a worker
# fails, torchrun restarts all of them (up to 3 times); the restarted workers continue from
# the newest checkpoint in SAVE_PATH (TORCHELASTIC_RESTART_COUNT > 0 means resume_from "auto").
# The save path and the checkpoints are added to ARGS where it lacks them (a restart without
# checkpoints would start over).
SETTINGS=()
for default in "save_path=$SAVE_PATH" checkpoint_every=1 checkpoint_every_steps=200; do
    [[ $ARGS == *"${default%%=*}:"* ]] || SETTINGS+=(--set "args.$default")
done
torchrun --nnodes=2 --node_rank="$NODE_RANK" --nproc_per_node="$GPUS" --max-restarts=3 \
    --master_addr="$MASTER_ADDR" --master_port=29500 \
    -m gears_ddp train --config "$CONFIG" ${SETTINGS[@]+"${SETTINGS[@]}"}
