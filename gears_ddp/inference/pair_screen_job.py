"""In-silico combinatorial screens: every pair of a gene set predicted by a trained model and
scored for genetic interactions, as ``GI_predict`` scores one pair.

A screen of N genes has N(N-1)/2 pairs, in the order of ``itertools.combinations`` over the
genes as given. The parts:

- ``PairScreenJob``: what is screened and how. The genes (checked against the perturbation
  vocabulary and GO, every gene that cannot be screened named at once), the predictor of
  the changes over control (``prediction.ChangePredictor``: exact, or with the published
  sampling noise), the genes the scores are taken on, and the Theil-Sen subsets, drawn
  once. It is picklable: each spawned worker receives one.
- ``score_chunks``: the pairs come in chunks of ``chunk_pairs``. The singles' changes are
  predicted once per process, each chunk's doubles in forward passes of
  ``prediction.sets_per_pass`` sets, and the chunk's pairs are scored in batches
  (``interactions.scores``); no Python work per pair.
- ``PairScreenFolder``: with an output file (``screens/x.csv``), each finished chunk is
  written atomically to a folder beside it, named as the table with ``.partial`` for
  ``.csv`` (``screens/x.partial/``), with a record of the model, genes and options. A
  screen run again continues from the chunks there; one of another model, genes or
  options is refused, naming what differs, unless asked to overwrite. When every chunk is
  there the table is written, with the record beside it (``screens/x.json``), and the
  partial folder is removed.
- ``run_pair_screen``: all of it, the chunks computed by an executor: in this process
  (``score_chunks_here``) or by spawned workers (``distributed.pair_screen_workers``).

What a screen takes besides the model and the genes is declared once, in
``pair_screen_options.PairScreenOptions``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from gears_ddp._logging import get_logger
from gears_ddp.data.io import atomic_path, file_in_the_way
from gears_ddp.data.screen_report import listed
from gears_ddp.inference.pair_screen_options import PAIR_SCREEN_CHUNK_PAIRS
from gears_ddp.inference.prediction import DRAWN_CELLS_CHANGE, ChangePredictor, checked_draw_seed, sets_per_pass
from gears_ddp.interactions.pair_tables import pair_table, score_gene_positions, with_training_columns
from gears_ddp.interactions.scores import GI_SCORE_NAMES, interaction_scores, theil_sen_subsets
from gears_ddp.model.model_folder import parameter_digest
from gears_ddp.report.run_files import write_json
from gears_ddp.runtime.folder_lock import FolderLock

logger = get_logger(__name__)

RECORD_FORMAT = "gears_ddp screen 1"
# the fix every refused output names, in Python and on the command line
OVERWRITE_HINT = "pass overwrite=True (gears-ddp screen --overwrite)"
# how many genes an error message names before it counts the rest
NAMED_GENES = 5
# what makes two screens the same screen, with what to call a difference
RECORD_IDENTITY = {
    "model": "the model's weights and graphs",
    "genes": "the screened genes",
    "score_genes": "the genes the scores are taken on",
    "change": "the change vectors scored",
    "seed": "the seed of the drawn control cells",
    "chunk_pairs": "the chunk size",
}
# the columns of a screen's table besides the scores and the interaction types
PAIR_SCREEN_COLUMN_MEANINGS = {
    "pair, first_gene, second_gene": "the pair (A+B) and its genes, in the order of itertools.combinations over "
    "the genes as given",
    "seen_in_training": "whether A+B (or B+A) is a condition of the model's train set: if not, the pair's "
    "prediction is an extrapolation",
    "singles_in_training": "how many of A+ctrl and B+ctrl are in the train set (0, 1 or 2)",
}


def model_record(network, weights_from: str | None) -> dict:
    """The model a screen uses: a digest of its weights and graphs, and where they came from."""
    return {"weights": parameter_digest(network), "from": weights_from}


def checked_pair_screen_genes(genes, node_map_pert: Mapping[str, int], gene2go: Mapping) -> list[str]:
    """``genes`` as a list of names, or an error: fewer than 2 genes, a gene named twice, or
    genes the model cannot perturb (all named at once, those without GO annotation apart)."""
    if isinstance(genes, str) or not isinstance(genes, Sequence) or not all(isinstance(g, str) for g in genes):
        raise ValueError(f"genes must be a list of gene names, e.g. ['FEV', 'SAMD1', 'CBL']; got {genes!r}")
    genes = list(genes)
    if len(genes) < 2:
        raise ValueError(f"a screen needs at least 2 genes (it scores their pairs), got {len(genes)}: {genes}")
    twice = sorted({g for g in genes if genes.count(g) > 1})
    if twice:
        raise ValueError(f"genes named more than once: {twice}; give each gene once")
    unknown = [g for g in genes if g not in node_map_pert]
    if unknown:
        without_go = [g for g in unknown if g not in gene2go]
        elsewhere = [g for g in unknown if g in gene2go]
        reasons = (
            [f"without GO annotation (GEARS reaches a perturbed gene through its GO neighbours): {without_go}"]
            if without_go
            else []
        ) + (
            [f"annotated in GO but not in the model's perturbation vocabulary (GEARS.pert_list): {elsewhere}"]
            if elsewhere
            else []
        )
        raise ValueError(
            f"{len(unknown)} of the {len(genes)} genes cannot be perturbed by this model; " + "; ".join(reasons)
        )
    return genes


@dataclass
class PairScreenJob:
    """Everything a process needs to score any chunk of a screen (see the module docstring).

    ``gene_sets``: the screened genes' perturbation-vocabulary indices; ``score_genes``:
    positions of the genes the scores are taken on (None: all); ``subsets``: the Theil-Sen
    subsets of that many genes; ``train_conditions``: the perturbed conditions of the train
    set; ``model``: ``model_record``.
    """

    genes: list[str]
    gene_sets: torch.Tensor
    predictor: ChangePredictor
    score_genes: np.ndarray | None
    score_genes_from: str | None
    subsets: np.ndarray
    train_conditions: list[str]
    model: dict
    chunk_pairs: int = PAIR_SCREEN_CHUNK_PAIRS

    @classmethod
    def build(
        cls,
        genes,
        node_map_pert: Mapping[str, int],
        gene2go: Mapping,
        gene_list: Sequence[str],
        predictor: ChangePredictor,
        genes_file=None,
        train_conditions: Sequence[str] = (),
        model: dict | None = None,
        chunk_pairs: int = PAIR_SCREEN_CHUNK_PAIRS,
    ) -> "PairScreenJob":
        """Check the genes (the options were checked: ``PairScreenOptions``) and draw the
        Theil-Sen subsets (seconds for thousands of genes)."""
        genes = checked_pair_screen_genes(genes, node_map_pert, gene2go)
        score_genes = score_gene_positions(gene_list, genes_file)
        n_score_genes = len(gene_list) if score_genes is None else len(score_genes)
        return cls(
            genes,
            torch.tensor([node_map_pert[g] for g in genes]),
            predictor,
            score_genes,
            None if genes_file is None else str(genes_file),
            theil_sen_subsets(n_score_genes),
            list(train_conditions),
            model or {},
            chunk_pairs,
        )

    @property
    def n_pairs(self) -> int:
        return len(self.genes) * (len(self.genes) - 1) // 2

    @property
    def n_chunks(self) -> int:
        return -(-self.n_pairs // self.chunk_pairs)

    def pairs(self) -> np.ndarray:
        """(pairs x 2) positions in ``genes`` of each pair's genes, in screen order."""
        return np.stack(np.triu_indices(len(self.genes), 1), axis=1)

    def chunk_bounds(self, chunk: int) -> tuple[int, int]:
        """The first pair of ``chunk`` and the pair after its last."""
        return chunk * self.chunk_pairs, min((chunk + 1) * self.chunk_pairs, self.n_pairs)

    def record(self) -> dict:
        """What this screen is, for its output's record: two screens with the same
        ``RECORD_IDENTITY`` entries compute the same table."""
        score_genes: dict[str, str | int | None]
        if self.score_genes is None:
            score_genes = {"from": "all genes", "count": None, "digest": None}
        else:
            digest = hashlib.blake2b(self.score_genes.tobytes(), digest_size=16).hexdigest()
            score_genes = {"from": self.score_genes_from, "count": len(self.score_genes), "digest": digest}
        return {
            "format": RECORD_FORMAT,
            "model": self.model,
            "genes": self.genes,
            "score_genes": score_genes,
            "change": self.predictor.change,
            "seed": self.predictor.seed if self.predictor.change == DRAWN_CELLS_CHANGE else None,
            "chunk_pairs": self.chunk_pairs,
            "pairs": self.n_pairs,
        }

    def with_draw_seed(self, seed: int) -> "PairScreenJob":
        """The same screen with control cells drawn with ``seed`` (the drawn-cells change);
        the network, control cells and Theil-Sen subsets are shared, not copied."""
        predictor = dataclasses.replace(self.predictor, seed=checked_draw_seed(seed))
        return dataclasses.replace(self, predictor=predictor)

    def restricted(self, changes: torch.Tensor) -> torch.Tensor:
        """``changes`` (sets x genes) on the genes the scores are taken on."""
        if self.score_genes is None:
            return changes
        return changes.index_select(1, torch.as_tensor(self.score_genes, device=changes.device))


def pair_sets(gene_sets: torch.Tensor, pairs: np.ndarray) -> torch.Tensor:
    """The perturbation sets (pairs x 2 vocabulary indices) of ``pairs`` of positions."""
    return gene_sets[torch.as_tensor(pairs)]


def single_sets(gene_sets: torch.Tensor) -> torch.Tensor:
    """The perturbation sets (genes x 2, -1 padded) of each gene alone."""
    return torch.stack((gene_sets, torch.full_like(gene_sets, -1)), dim=1)


def score_chunks(
    job: PairScreenJob,
    chunks: Sequence[int],
    store: Callable[[int, dict], None],
    device: torch.device | str | None = None,
    label: str = "screen",
) -> None:
    """Predict and score the pairs of ``chunks``, handing each chunk's scores (score name ->
    array over its pairs) to ``store(chunk, scores)`` as soon as it is done; on ``device``
    (default: the predictor's)."""
    if not len(chunks):
        return
    predictor = job.predictor if device is None else job.predictor.to(device)
    singles = job.restricted(predictor.changes(single_sets(job.gene_sets)))
    pairs = job.pairs()
    started, done = time.perf_counter(), 0
    for number, chunk in enumerate(chunks, 1):
        start, stop = job.chunk_bounds(chunk)
        rows = pairs[start:stop]
        doubles = job.restricted(predictor.changes(pair_sets(job.gene_sets, rows)))
        index = torch.as_tensor(rows, device=singles.device)
        store(
            chunk,
            interaction_scores(
                singles[index[:, 0]], singles[index[:, 1]], doubles, device=predictor.device, subsets=job.subsets
            ),
        )
        done += stop - start
        logger.info(
            "%s: chunk %d of %d done (pairs %d-%d), %.2f pairs/s",
            label,
            number,
            len(chunks),
            start,
            stop - 1,
            done / (time.perf_counter() - started),
        )


def score_chunks_here(
    job: PairScreenJob,
    chunks: Sequence[int],
    folder: "PairScreenFolder | None",
    device: torch.device | str | None = None,
) -> dict[int, dict]:
    """The executor of one process: score ``chunks`` here (on ``device``), writing each to
    ``folder`` when there is one (the result is then empty), else returning them."""
    results: dict[int, dict] = {}
    score_chunks(job, chunks, results.__setitem__ if folder is None else folder.write_chunk, device)
    return results


def run_pair_screen(
    job: PairScreenJob,
    out=None,
    overwrite: bool = False,
    execute: Callable[[PairScreenJob, list[int], "PairScreenFolder | None"], dict] = score_chunks_here,
) -> pd.DataFrame:
    """The screen's table (``pair_screen_table``), its chunks computed by ``execute(job, chunks,
    folder)``; with ``out``, resumable and written there (see ``PairScreenFolder``)."""
    folder = None if out is None else PairScreenFolder(out)
    with contextlib.nullcontext() if folder is None else held_output(folder.table):
        return _run_pair_screen(job, folder, overwrite, execute)


def _run_pair_screen(job: PairScreenJob, folder: "PairScreenFolder | None", overwrite: bool, execute) -> pd.DataFrame:
    record = job.record()
    done = folder.prepare(record, overwrite) if folder is not None else set()
    if done is None:
        assert folder is not None  # only a folder holds a finished screen
        logger.info("%s already holds this screen; nothing to compute (overwrite to compute it again)", folder.table)
        return folder.read_table()
    remaining = [chunk for chunk in range(job.n_chunks) if chunk not in done]
    logger.info(
        "screen of %d genes: %d pairs in %d chunks, %d to compute",
        len(job.genes),
        job.n_pairs,
        job.n_chunks,
        len(remaining),
    )
    started = time.perf_counter()
    results = execute(job, remaining, folder)
    chunks = (
        [folder.read_chunk(chunk, job) for chunk in range(job.n_chunks)]
        if folder is not None
        else [results[chunk] for chunk in range(job.n_chunks)]
    )
    scores = {name: np.concatenate([chunk[name] for chunk in chunks]) for name in GI_SCORE_NAMES}
    table = pair_screen_table(job, scores)
    if folder is not None:
        folder.finish(table, {**record, "seconds": round(time.perf_counter() - started, 1)})
    return table


def pair_screen_table(job: PairScreenJob, scores: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """One row per pair, in screen order: ``pair_table``'s columns, with ``training_columns``
    before the interaction types."""
    pairs = job.pairs()
    first = [job.genes[i] for i in pairs[:, 0]]
    second = [job.genes[j] for j in pairs[:, 1]]
    return with_training_columns(pair_table(first, second, scores), job.train_conditions)


def pair_screen_changes(job: PairScreenJob, gene_names: Sequence[str]):
    """The predicted changes the screen scores, over every gene, as an AnnData: one row per
    single (``'A+ctrl'``) then per pair (``'A+B'``, screen order), ``obs`` naming the genes,
    ``var['gene_name']``, the screen's record in ``uns['gears_ddp_screen']``. Rows x genes
    float32, in memory and in the file: the predictor computes in float64 (for the scores),
    and each forward pass's changes are cast as they come, so half the memory, and the file
    half the size, of float64; for big screens still a lot."""
    import anndata

    pairs = job.pairs()
    sets = torch.cat((single_sets(job.gene_sets), pair_sets(job.gene_sets, pairs)))
    changes = np.empty((len(sets), len(gene_names)), dtype=np.float32)
    per_pass = sets_per_pass(len(gene_names), job.predictor.device)
    for start in range(0, len(sets), per_pass):
        changes[start : start + per_pass] = job.predictor.changes(sets[start : start + per_pass]).cpu().numpy()
    first = job.genes + [job.genes[i] for i in pairs[:, 0]]
    second = ["ctrl"] * len(job.genes) + [job.genes[j] for j in pairs[:, 1]]
    conditions = [f"{a}+{b}" for a, b in zip(first, second)]
    obs = pd.DataFrame(
        {"condition": conditions, "first_gene": first, "second_gene": [None if b == "ctrl" else b for b in second]},
        index=pd.Index(conditions, name="perturbation"),
    )
    var = pd.DataFrame({"gene_name": list(gene_names)}, index=pd.Index(list(gene_names)))
    return anndata.AnnData(X=changes, obs=obs, var=var, uns={"gears_ddp_screen": _without_none(job.record())})


def _without_none(value):
    """``value`` with None dictionary entries left out (h5ad cannot store None)."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


class PairScreenFolder:
    """Where a screen writing to ``out`` (a .csv file, ``screens/x.csv``) keeps its work.

    ``screens/x.partial/record.json`` and ``chunk-NNNNNNN.npz`` (one per finished chunk,
    written atomically, numbers only) while it runs; then ``out`` (the table) and
    ``screens/x.json`` (the record), and the partial folder is removed.
    """

    def __init__(self, out):
        self.table = checked_output_file(out, "the screen's table", "CSV", (".csv",))
        self.record_file = self.table.with_suffix(".json")
        self.partial = self.table.with_suffix(".partial")

    def prepare(self, record: dict, overwrite: bool) -> set[int] | None:
        """Get ready to compute ``record``'s screen: the chunks already done (None when the
        whole table is there). Work of another screen is refused, naming what differs,
        unless ``overwrite``, which removes it without reading it (so a broken record is
        replaced too)."""
        if overwrite:
            shutil.rmtree(self.partial, ignore_errors=True)
            self.record_file.unlink(missing_ok=True)
        else:
            found, where = self._existing_record()
            if found is None and self.table.exists():
                raise FileExistsError(
                    f"{self.table} exists and is not a screen's table (no {self.record_file.name} "
                    f"beside it): {OVERWRITE_HINT} to replace it"
                )
            differences = [] if found is None else record_differences(found, record)
            if differences:
                raise FileExistsError(
                    f"{where} holds a screen that differs in {'; '.join(differences)}; {OVERWRITE_HINT} to "
                    "replace it, or write to another file"
                )
            if found is not None and where == self.record_file and self.table.exists():
                return None
        self.partial.mkdir(parents=True, exist_ok=True)
        write_json(self.partial / "record.json", record)
        return {int(path.stem.split("-")[1]) for path in self.partial.glob("chunk-*.npz")}

    def _existing_record(self) -> tuple[dict | None, Path | None]:
        """The record of the screen found here (finished, else under way) and its file."""
        for path in (self.record_file, self.partial / "record.json"):
            if path.exists():
                found = read_record(path)
                if found.get("format") != RECORD_FORMAT:
                    raise ValueError(
                        f"{path} is not the record of a screen of one model ({RECORD_FORMAT!r}; it "
                        f"holds {found.get('format')!r}); remove it, or {OVERWRITE_HINT}"
                    )
                return found, path
        return None, None

    def chunk_path(self, chunk: int) -> Path:
        return self.partial / f"chunk-{chunk:07d}.npz"

    def write_chunk(self, chunk: int, scores: Mapping[str, np.ndarray]) -> None:
        with atomic_path(self.chunk_path(chunk)) as tmp, open(tmp, "wb") as handle:
            arrays: dict[str, Any] = {name: np.asarray(scores[name], dtype=np.float64) for name in GI_SCORE_NAMES}
            np.savez(handle, **arrays)

    def read_chunk(self, chunk: int, job: PairScreenJob) -> dict[str, np.ndarray]:
        """The scores of a finished chunk; a missing, unreadable or wrong-sized file is an
        error naming it."""
        path = self.chunk_path(chunk)
        start, stop = job.chunk_bounds(chunk)
        try:
            with np.load(path, allow_pickle=False) as data:
                scores = {name: data[name] for name in GI_SCORE_NAMES}
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(
                f"cannot read the screen chunk {path}: {err}; delete it and run the screen again to recompute it"
            ) from None
        if any(values.shape != (stop - start,) for values in scores.values()):
            raise ValueError(
                f"the screen chunk {path} does not hold the {stop - start} pairs of chunk {chunk}; "
                "delete it and run the screen again to recompute it"
            )
        return scores

    def finish(self, table: pd.DataFrame, record: dict) -> None:
        """Write the table and the record; remove the partial folder."""
        write_table(table, self.table)
        write_json(self.record_file, record)
        shutil.rmtree(self.partial, ignore_errors=True)
        logger.info("screen table written to %s (%d pairs), its record to %s", self.table, len(table), self.record_file)

    def read_table(self) -> pd.DataFrame:
        return read_table(self.table)


def checked_output_file(path, what: str, kind: str, suffixes: Sequence[str]) -> Path:
    """``path`` as a Path, or an error naming the problem before any work is done: a name
    without one of ``suffixes`` (``kind`` says what they are), a folder at ``path``, or a
    file where a folder above it would have to be."""
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        names = " or ".join(f"*{suffix}" for suffix in suffixes)
        raise ValueError(f"{what} is written as {kind}: name it {names} (got {path})")
    if path.is_dir():
        raise ValueError(f"{path} is a folder; {what} needs a file name")
    blocker = file_in_the_way(path.parent)
    if blocker is not None:
        raise ValueError(f"{what} cannot be written to {path}: {blocker} is a file, not a folder")
    return path


def held_output(table: Path) -> FolderLock:
    """The lock a screen writing ``table`` holds while it runs (its folder made first): a
    second screen to the same table is refused, naming the first (``runtime.folder_lock``)."""
    table.parent.mkdir(parents=True, exist_ok=True)
    return FolderLock(
        table.parent,
        f"a pair screen writing {table.name}",
        "or write this screen to another --out",
        lock_name=f".{table.name}.lock",
        record_name=f".{table.name}.owner.json",
    )


def write_table(table: pd.DataFrame, path: Path) -> None:
    """A screen's table as CSV, atomically, each float as the shortest text that reads back
    to it (``repr``: ``read_table`` gives the very values, and a float column of whole
    numbers stays a float column)."""
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False, float_format=lambda value: repr(float(value)))


# pandas before 3.1 reads a float's shortest text back to the very value only with its
# round-trip converter; since 3.1 every converter does, and the option is deprecated
EXACT_FLOATS = {} if torch.torch_version.TorchVersion(pd.__version__) >= "3.1" else {"float_precision": "round_trip"}


def read_table(path: Path) -> pd.DataFrame:
    """A table ``write_table`` wrote, each float the value written."""
    return pd.read_csv(path, **EXACT_FLOATS)


def record_differences(found: dict, wanted: dict) -> list[str]:
    """What differs between the screen recorded there (``found``) and the one wanted here,
    one phrase per entry of ``RECORD_IDENTITY`` with both values (for the genes: which are
    there only and here only), so that a refused output says what to change."""
    return [
        f"{meaning} ({_difference(key, found.get(key), wanted.get(key))})"
        for key, meaning in RECORD_IDENTITY.items()
        if _compared(key, found.get(key)) != _compared(key, wanted.get(key))
    ]


def _compared(key: str, value):
    """The part of a record's ``key`` entry that makes two screens differ: the model's
    weights (not where they came from), the count and digest of the genes the scores are
    taken on (not the name of their file)."""
    if key == "model":
        return (value or {}).get("weights")
    if key == "score_genes":
        return [(value or {}).get(part) for part in ("count", "digest")]
    return value


def _difference(key: str, there, here) -> str:
    """How a record's ``key`` entry differs between two screens, in words."""
    if key == "genes":
        return _genes_difference(there or [], here or [])
    return f"{_shown(key, there)} there, {_shown(key, here)} here"


def _genes_difference(there: list[str], here: list[str]) -> str:
    """How two screens' gene lists differ: their counts and the genes of one only, or the
    same genes in another order (which orders the pairs otherwise)."""
    there_set, here_set = set(there), set(here)
    if there_set == here_set:
        return "the same genes in another order, which orders the pairs otherwise"
    parts = [f"{len(there)} there, {len(here)} here"]
    for side, genes in (
        ("there", [g for g in there if g not in here_set]),
        ("here", [g for g in here if g not in there_set]),
    ):
        if genes:
            parts.append(f"only {side}: {listed(genes, NAMED_GENES)}")
    return "; ".join(parts)


def _shown(key: str, value) -> str:
    """A record's ``key`` entry in an error message: where the model came from, the genes
    the scores are taken on, or the value (None, as the seed of the exact change: none)."""
    if key == "model":
        return str((value or {}).get("from"))
    if key == "score_genes":
        value = value or {}
        return "all genes" if value.get("count") is None else f"{value['count']} genes of {value.get('from')}"
    return "none" if value is None else str(value)


def read_record(path: Path) -> dict:
    """A screen's record (a JSON object); one that cannot be read is an error naming it."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(
            f"cannot read the screen record {path}: {err}; remove it, or {OVERWRITE_HINT}, to start the screen again"
        ) from None
    if not isinstance(found, dict):
        raise ValueError(f"{path} is not a screen record; remove it, or {OVERWRITE_HINT}")
    return found
