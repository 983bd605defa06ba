"""Gene sets in the GMT format (Enrichr, MSigDB) as GO terms per gene.

A GMT file holds one gene set a line, tab-separated: the set's name, a description (often
empty or a URL), then its genes. ``read_gene_sets`` turns it into what ``gene2go_all.pkl``
holds, gene symbol -> set of terms, so that ``go_files.write_go_files`` builds the GO files
from it as from a GAF file: GEARS needs only which genes share terms (the Jaccard
similarity of two genes' term sets). A set named with its GO id, as Enrichr names them
(``'mitotic spindle assembly (GO:0090307)'``), is that id; any other set is its name.
Genes are taken as written: a perturbed gene that the file spells otherwise (an older
symbol) has no sets, and ``PertData`` names it.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

GO_ID = re.compile(r"\((GO:\d{7})\)\s*$")
GZIP_MAGIC = b"\x1f\x8b"


def read_gene_sets(path) -> dict[str, set[str]]:
    """Gene symbol -> the terms (GO ids, or set names) of the GMT file ``path`` (``.gmt``,
    or gzip-compressed) whose sets hold it. ``ValueError`` naming the file and line for a
    line that is no gene set, or a file that is not GMT text."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"gene set file {path} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    with open(path, "rb") as handle:
        compressed = handle.read(2) == GZIP_MAGIC
    gene2terms: dict[str, set[str]] = {}
    try:
        with (gzip.open if compressed else open)(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                fields = line.rstrip("\r\n").split("\t")
                genes = [gene.split(",")[0].strip() for gene in fields[2:]]  # Enrichr's 'GENE,1.0' weights dropped
                genes = [gene for gene in genes if gene]
                if not fields[0].strip() or not genes:
                    raise ValueError(
                        f"{path} line {number} is no gene set: a GMT line is the set's name, a "
                        f"description and its genes, separated by tabs; it reads {line[:80]!r}"
                    )
                match = GO_ID.search(fields[0])
                term = match.group(1) if match else fields[0].strip()
                for gene in genes:
                    gene2terms.setdefault(gene, set()).add(term)
    except (UnicodeDecodeError, OSError, EOFError) as err:  # binary content, a damaged gzip stream
        raise ValueError(
            f"cannot read the gene set file {path} ({type(err).__name__}: {err}): expected GMT text "
            "(name, description, genes; tab-separated), plain or gzip-compressed"
        ) from None
    if not gene2terms:
        raise ValueError(f"{path} holds no gene sets")
    return gene2terms
