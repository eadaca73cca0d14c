#!/usr/bin/env python3
"""Checks the documentation: README.md is short and every relative link resolves.

    python3 .ci/check_docs.py [ROOT]

Fails (exit 1, one line per problem as FILE:LINE: message) when
- README.md has more than 250 lines;
- a relative link in README.md or docs/*.md points to a file that does not exist,
  or to an #anchor that is not a heading of the target Markdown file (GitHub's
  slugs: lower case, punctuation dropped except '-' and '_', spaces to '-',
  '-1', '-2', ... for repeated headings);
- a docs/*.md file is not linked from README.md.
External links (http:, https:, mailto:) are not checked. Python 3 standard library only.
"""

import re
import sys
import unicodedata
from functools import cache
from pathlib import Path

README_MAX_LINES = 250
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# [text](target) and ![alt](target); the text may hold `code` and one level of [..].
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ID = re.compile(r"""<a\s+[^>]*(?:name|id)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def strip_code_spans(line):
    """The line with the contents of inline code spans blanked (links there are text)."""
    return CODE_SPAN.sub(lambda m: m.group(1) + " " * len(m.group(2)) + m.group(1), line)


def markdown_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                continue
            yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not line.strip()[len(m.group(1)):].strip():
            fence = None


def heading_text_to_slug(text):
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in " -" or cat[0] in "LMN" or cat == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


@cache
def anchors_of(path):
    """Every anchor a Markdown file defines: heading slugs (with GitHub's -1, -2
    suffixes for repeats) and explicit <a name|id="..."> anchors."""
    text = path.read_text(encoding="utf-8")
    anchors, counts = set(), {}
    previous = None
    for _, line in markdown_lines(text):
        heading = None
        m = ATX.match(line)
        if m:
            heading = m.group(2) or ""
        elif previous is not None and previous.strip() and SETEXT.match(line) \
                and not ATX.match(previous) and not previous.lstrip().startswith(("-", "*", ">", "|")):
            heading = previous.strip()
        if heading is not None:
            slug = heading_text_to_slug(heading)
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
        anchors.update(a.lower() for a in HTML_ID.findall(line))
        previous = line
    return anchors


def links_of(text):
    """(line number, target) of every inline link, image and reference definition."""
    for number, line in markdown_lines(text):
        m = REF_DEF.match(line)
        if m:
            yield number, m.group(1)
            continue
        for m in INLINE_LINK.finditer(strip_code_spans(line)):
            yield number, m.group(1)


def check_file(root, path, problems):
    """Problems of the relative links in `path`; the set of files they reach."""
    reached = set()
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(root)
    for number, target in links_of(text):
        target = target.strip("<>")
        if not target or EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        if file_part.startswith("/"):
            dest = root / file_part.lstrip("/")
        elif file_part:
            dest = path.parent / file_part
        else:
            dest = path
        dest_display = file_part or str(where)
        if not dest.exists():
            problems.append(f"{where}:{number}: link to {target}: {dest_display} does not exist")
            continue
        reached.add(dest.resolve())
        if anchor and dest.is_file() and dest.suffix.lower() == ".md":
            if anchor.lower() not in anchors_of(dest.resolve()):
                problems.append(
                    f"{where}:{number}: link to {target}: no heading #{anchor} in {dest_display}"
                )
    return reached


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
    root = root.resolve()
    readme = root / "README.md"
    problems = []
    if not readme.is_file():
        print(f"README.md: missing in {root}")
        return 1
    lines = len(readme.read_text(encoding="utf-8").splitlines())
    if lines > README_MAX_LINES:
        problems.append(f"README.md:{lines}: {lines} lines, more than {README_MAX_LINES}")
    docs = sorted((root / "docs").glob("*.md"))
    from_readme = check_file(root, readme, problems)
    for doc in docs:
        check_file(root, doc, problems)
    for doc in docs:
        if doc.resolve() not in from_readme:
            problems.append(f"{doc.relative_to(root)}:1: not linked from README.md")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"docs OK: README.md {lines} lines (max {README_MAX_LINES}), "
          f"{len(docs)} docs/*.md files, every relative link and anchor resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
