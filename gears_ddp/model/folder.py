"""A trained model on disk, in the published GEARS format.

A model folder holds ``config.pkl`` (the published keys: model options, graphs, sizes) and
``model.pt`` (the network's state dict), which the published package reads and writes, and
``vocabulary.json``, which records the gene and perturbation names so that loading a model
into other data fails clearly instead of silently mis-assigning genes.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from gears_ddp.data import io
from gears_ddp.model.network import GEARSModel

CONFIG_FILE, WEIGHTS_FILE, VOCABULARY_FILE = "config.pkl", "model.pt", "vocabulary.json"


def model_from_config(config: dict) -> GEARSModel:
    """The network described by a published-format config dict (graphs included)."""
    return GEARSModel(config["num_genes"], config["num_perts"], config["G_coexpress"], config["G_coexpress_weight"],
                      config["G_go"], config["G_go_weight"], hidden_size=config["hidden_size"],
                      num_go_gnn_layers=config["num_go_gnn_layers"],
                      num_gene_gnn_layers=config["num_gene_gnn_layers"],
                      decoder_hidden_size=config["decoder_hidden_size"], uncertainty=config["uncertainty"],
                      no_perturb=config["no_perturb"])


def strip_module_prefix(state_dict: dict) -> dict:
    """Remove the ``module.`` prefix that DataParallel / DistributedDataParallel add."""
    return {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state_dict.items()}


def save_model_folder(path, config: dict, state_dict: dict, gene_names, pert_names) -> None:
    """The published model files plus the vocabularies, each written atomically."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    io.write_pickle({**config, "device": str(config["device"])}, path / CONFIG_FILE)
    with io.atomic_path(path / WEIGHTS_FILE) as tmp:
        torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, tmp)
    with io.atomic_path(path / VOCABULARY_FILE) as tmp:
        tmp.write_text(json.dumps({"genes": list(gene_names), "perturbations": list(pert_names)}))


def read_config(path) -> dict:
    """The ``config.pkl`` of a model folder."""
    return io.read_pickle(Path(path) / CONFIG_FILE, "GEARS model config")


def read_weights(path) -> dict:
    """The state dict of a model folder (a ``module.`` prefix removed)."""
    weights = Path(path) / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} in the model folder {path}")
    try:
        return strip_module_prefix(torch.load(weights, map_location="cpu", weights_only=True))
    except Exception as err:  # torch raises many types for damaged or refused files
        raise ValueError(f"cannot read model weights {weights}: {type(err).__name__}: {err}") from err


def check_vocabulary(path, config: dict, gene_names, pert_names) -> None:
    """Refuse a model whose gene or perturbation vocabulary differs from the data's."""
    path = Path(path)
    saved = path / VOCABULARY_FILE
    if saved.exists():
        vocabulary = json.loads(saved.read_text())
        for what, theirs, ours in (("gene", vocabulary["genes"], list(gene_names)),
                                   ("perturbation", vocabulary["perturbations"], list(pert_names))):
            if theirs != ours:
                differ = sorted(set(theirs) ^ set(ours))
                raise ValueError(f"checkpoint {path} was trained on another {what} vocabulary "
                                 f"({len(theirs)} vs {len(ours)} names in the data"
                                 + (f"; differing: {differ[:10]}" if differ else "; same names, other order") + ")")
    elif (config["num_genes"], config["num_perts"]) != (len(gene_names), len(pert_names)):
        raise ValueError(f"checkpoint {path} has {config['num_genes']} genes and {config['num_perts']} "
                         f"perturbation genes; the data has {len(gene_names)} and {len(pert_names)}")
