"""One numbering: the chapter files, the ledger's chapter plan and every "chapter N" in the project's text use
the numbers the reader sees in the rendered book (the table of contents numbers its chapters in order, across
its numbered parts)."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# A mention: "chapter 5", "Chapter 05", "chapters 01, 05 and 07", "chapters 10-12".
MENTION = re.compile(r"\b[Cc]hapters? (\d{1,2}(?:(?:, | and | or | to |-|–)\d{1,2})*)\b")


def numbered_chapters() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [c["file"] for part in toc["parts"] if part.get("numbered") for c in part["chapters"]]


def texts():
    """The project's own text: pages' sources, run templates, presets, the library, the README and Makefile
    (executed notebooks are generated from these)."""
    patterns = ["book/*.md", "book/claims.yml", "chapters/*.md", "runs/*.md", "runs/presets/**/*.yml", "runs/*.sh",
                "lib/**/*.py", "lib/**/*.md", "tests/*.py", "README.md", "Makefile", "_config.yml", "_toc.yml"]
    for pattern in patterns:
        for path in sorted(ROOT.glob(pattern)):
            if path.name != Path(__file__).name and ".venv" not in path.parts:
                yield path


def test_chapter_files_carry_the_number_the_reader_sees():
    files = numbered_chapters()
    assert files, "no numbered part in _toc.yml"
    for i, file in enumerate(files, start=1):
        assert Path(file).name.startswith(f"{i:02d}_"), (
            f"_toc.yml's chapter {i} is {file}: name its file chapters/{i:02d}_..., or the text's 'chapter N' and the "
            "rendered numbers part ways")


def test_the_ledger_plans_the_chapters_of_the_table_of_contents():
    ledger = yaml.safe_load((ROOT / "book" / "claims.yml").read_text())
    assert [c.removesuffix(".md") for c in ledger["chapters"]] == numbered_chapters()


def test_every_chapter_mention_names_a_chapter_that_exists():
    count = len(numbered_chapters())
    bad = []
    for path in texts():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            for m in MENTION.finditer(line):
                numbers = [int(x) for x in re.findall(r"\d+", m.group(1))]
                if any(not 1 <= k <= count for k in numbers):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}")
    assert not bad, f"mentions of chapters the book does not have (it has 1-{count}):\n" + "\n".join(bad)


def test_a_mention_beside_a_link_names_the_linked_chapter():
    """'chapter N' followed within the sentence by a link to a chapter file names that file's number."""
    link = re.compile(r"\b[Cc]hapter (\d{1,2})\b[^.\n]{0,80}?\(\.{0,2}/?(?:\.\./)*chapters/(\d{2})_")
    bad = []
    for path in texts():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            for m in link.finditer(line):
                if int(m.group(1)) != int(m.group(2)):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}")
    assert not bad, "\n".join(bad)
