"""How often the interaction calls of the observed combinations recover the interaction types
planted in the synthetic data, and why.

    python benchmarks/bench_observed_interactions.py [--seeds 1 2 3] [--combos 120]
                                                     [--data-path ./data/bench_observed_interactions] [--record]

Data: the synthetic generator's ``norman`` preset (500 genes, 48 CRISPRa-activated genes,
200 cells per condition, a library of 10,000 counts per cell), with ``--combos`` two-gene
combinations of which a quarter each are planted synergy, buffering and epistasis and the
rest additive (``gears_ddp.datasets.synthetic``, step 5: the combination's downstream
log-rate change is the singles' sum, times 1.5-2 for synergy, times 0.2-0.5 for buffering,
or one single's plus at most a fifth of the other's for epistasis; the direct effects on the
two targets add up in every type), one dataset per generator seed in ``--seeds``, written
once under ``--data-path``.

Each combination is scored as ``gears-ddp interactions`` scores it
(``interactions.observed``: the condition's mean expression minus the mean of the
control cells, the published GI scores on every gene, the published thresholds), from the
cells (``observed``) and, for the upper bound without sampling noise, from the generator's
noise-free mean profiles (``noise-free``). Then again on each pair's own responsive genes
only (the union of the top 20 DE genes of A, B and A+B in the data's own ranking,
``uns['rank_genes_groups_cov_all']``): not a published option, a diagnosis of what the
scores read. A planted type is recovered when the call it implies is made: synergy ->
``magnitude_type`` synergy (mag above 1.3), buffering -> suppressor (below 0.7), additive
-> additive (0.7 to 1.3), epistasis -> ``epistasis`` (dominance above 0.25).

Printed, pooled over the seeds, for each choice of genes: per planted type the pairs, the
median ``mag`` and ``dominance`` (noise-free and observed), the share of pairs whose call
recovers it, and the observed ``magnitude_type`` calls; the share recovered over all pairs;
and how far the observed calls agree with the noise-free ones (``compare_calls``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from harness.record import add_record_argument, recorded
from harness.tables import format_number, print_table

PLANTED_CALLS = {
    "additive": ("magnitude_type", "additive"),
    "synergy": ("magnitude_type", "synergy"),
    "buffering": ("magnitude_type", "suppressor"),
    "epistasis": ("epistasis", True),
}
INTERACTION_FRACTIONS = {"synergy": 0.25, "buffering": 0.25, "epistasis": 0.25}


def dataset(data_path: Path, seed: int, combos: int) -> Path:
    """The ``norman`` preset with ``combos`` combinations, a quarter of each non-additive type,
    in a data folder of its own (each seed has its own GO annotation)."""
    from gears_ddp.datasets import preset, write_synthetic_dataset

    options = {**preset("norman"), "n_combos": combos, "interaction_fractions": INTERACTION_FRACTIONS, "seed": seed}
    return write_synthetic_dataset(data_path / f"seed{seed}", name="observed_gi", **options)


def pair_scores(changes, pairs: list[tuple[str, str, str]], genes=None) -> pd.DataFrame:
    """The table of ``pairs`` (``(A+B, A single, B single)`` conditions) scored from
    ``changes(condition)`` (one value per gene) on every gene, or on ``genes(pair)`` only."""
    from gears_ddp.interactions.pair_tables import pair_table
    from gears_ddp.interactions.scores import GI_SCORE_NAMES, interaction_scores

    rows = []
    for pair in pairs:
        columns = slice(None) if genes is None else genes(pair)
        double, first, second = (torch.from_numpy(changes(condition)[columns][None]) for condition in pair)
        rows.append(interaction_scores(first, second, double))
    scores = {name: np.concatenate([row[name] for row in rows]) for name in GI_SCORE_NAMES}
    split = [pair[0].split("+") for pair in pairs]
    return pair_table([a for a, _ in split], [b for _, b in split], scores).set_index("pair")


def scored(folder: Path) -> dict[str, tuple]:
    """Per choice of genes (``all genes``, ``each pair's top DE genes``), one row per
    combination of a dataset: its planted type, and its scores and calls from the noise-free
    profiles (``free_*``) and from the cells (``observed_*``)."""
    from gears_ddp import PertData
    from gears_ddp.data.processing import top_de_positions
    from gears_ddp.datasets import read_ground_truth, read_true_means
    from gears_ddp.interactions.observed import observed_changes, observed_interactions, observed_pairs

    pert_data = PertData(folder.parent)
    pert_data.load(data_path=str(folder))
    cells = pert_data.cells
    pairs = observed_pairs(cells.conditions)
    free = read_true_means(folder)[list(pert_data.var.index)]
    free = {
        condition: values - free.loc["ctrl"].to_numpy(np.float64)
        for condition, values in zip(free.index, free.to_numpy(np.float64))
    }
    observed = dict(zip(cells.conditions, observed_changes(cells, cells.conditions)))
    names = dict(zip(cells.conditions, cells.condition_names))

    def de_genes(pair):
        return np.unique(
            np.concatenate(
                [top_de_positions(pert_data.uns, pert_data.var.index, names[condition]) for condition in pair]
            )
        )

    tables = {
        "all genes (published)": (
            pair_scores(free.__getitem__, pairs),
            observed_interactions(pert_data).set_index("pair"),
        ),
        "each pair's top 20 DE genes": (
            pair_scores(free.__getitem__, pairs, de_genes),
            pair_scores(observed.__getitem__, pairs, de_genes),
        ),
    }
    planted = read_ground_truth(folder)["interaction_types"]
    out = {}
    for choice, (free_table, observed_table) in tables.items():
        table = pd.DataFrame({"planted": [planted[pair[0]] for pair in pairs]}, index=[pair[0] for pair in pairs])
        for name in ("mag", "dominance", "magnitude_type", "epistasis"):
            table[f"free_{name}"], table[f"observed_{name}"] = free_table[name], observed_table[name]
        for source in ("free", "observed"):
            table[f"{source}_recovered"] = [
                table.at[pair, f"{source}_{PLANTED_CALLS[kind][0]}"] == PLANTED_CALLS[kind][1]
                for pair, kind in table["planted"].items()
            ]
        out[choice] = (table, free_table.reset_index(), observed_table.reset_index())
    return out


def print_choice(choice: str, parts: list) -> None:
    """The tables of one choice of genes, pooled over the datasets."""
    from gears_ddp.interactions.agreement import compare_calls

    table = pd.concat([part[0] for part in parts])
    print(f"\n### Scores on {choice}\n")
    rows = []
    for kind, (call_kind, call) in PLANTED_CALLS.items():
        part = table[table["planted"] == kind]
        calls = part["observed_magnitude_type"].value_counts()
        rows.append(
            [
                kind,
                f"{call_kind} {call}",
                len(part),
                *(
                    format_number(part[f"{source}_{name}"].median(), ".3f")
                    for name in ("mag", "dominance")
                    for source in ("free", "observed")
                ),
                *(format_number(part[f"{source}_recovered"].mean(), ".2f") for source in ("free", "observed")),
                " / ".join(str(calls.get(name, 0)) for name in ("additive", "synergy", "suppressor")),
            ]
        )
    print_table(
        [
            "planted",
            "call that recovers it",
            "pairs",
            "mag, noise-free",
            "mag, observed",
            "dominance, noise-free",
            "dominance, observed",
            "recovered, noise-free",
            "recovered, observed",
            "observed calls additive / synergy / suppressor",
        ],
        rows,
        left=2,
    )
    print(
        f"\nRecovered over all {len(table)} combinations: {table['free_recovered'].mean():.2f} from the noise-free "
        f"profiles, {table['observed_recovered'].mean():.2f} from the cells."
    )
    agreement = [compare_calls(free, observed) for _, free, observed in parts]
    pearson = ", ".join(f"{a['scores']['mag']['pearson']:.2f}" for a in agreement)
    kinds = ", ".join(f"{kind} {sum(a['types'][kind]['agree'] for a in agreement)}" for kind in agreement[0]["types"])
    print(
        f"Observed against noise-free calls of the same pairs: mag Pearson r {pearson} (per dataset); calls that "
        f"agree, of {len(table)}: {kinds}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--combos", type=int, default=120)
    parser.add_argument("--data-path", type=Path, default=Path("./data/bench_observed_interactions"))
    add_record_argument(parser)
    args = parser.parse_args()
    scored_sets = [scored(dataset(args.data_path, seed, args.combos)) for seed in args.seeds]
    with recorded(args.record):
        print(
            f"Synthetic `norman` preset with {args.combos} combinations (a quarter each planted synergy, buffering "
            f"and epistasis), generator seeds {args.seeds}."
        )
        for choice in scored_sets[0]:
            print_choice(choice, [scores[choice] for scores in scored_sets])


if __name__ == "__main__":
    main()
