"""Splice a benchmark's report.md into a documentation page (``docs/BENCHMARKS.md``).

The page marks each generated section with a pair of comments::

    <!-- draftgate-bench:engine start -->
    ...replaced on every run...
    <!-- draftgate-bench:engine end -->

Everything outside the markers is left alone. Headings of the text move one
level down, and the plots it links are copied next to the page (``benchmarks/SECTION/``)
so the links keep working when the output folder is gone.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from draftgate.errors import DraftGateError

__all__ = ["update_doc", "markers"]


def markers(section: str) -> tuple[str, str]:
    return f"<!-- draftgate-bench:{section} start -->", f"<!-- draftgate-bench:{section} end -->"


def update_doc(doc: Path, section: str, report_md: str, plots: list[Path]) -> None:
    """Replace the text between the section's markers with ``report_md`` (the plots it links copied beside the doc)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", section):
        raise DraftGateError(f"doc section must be letters, digits, '-' or '_', got {section!r}")
    start, end = markers(section)
    try:
        text = doc.read_text(encoding="utf-8")
    except OSError as e:
        raise DraftGateError(f"cannot read {doc}: {e.strerror or e}") from None
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise DraftGateError(f"{doc} has no section {section!r}: add the two lines\n{start}\n{end}")
    img_dir = doc.parent / "benchmarks" / section
    body = report_md
    for p in [p for p in plots if f"]({p.name})" in body]:
        img_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, img_dir / p.name)
        rel = os.path.relpath(img_dir / p.name, doc.parent).replace(os.sep, "/")
        body = body.replace(f"]({p.name})", f"]({rel})")
    body = re.sub(r"^(#+) ", r"#\1 ", body, flags=re.MULTILINE)  # "# DraftGate benchmark" -> "##"
    doc.write_text(text[: i + len(start)] + "\n" + body.strip() + "\n" + text[j:], encoding="utf-8")
