#!/usr/bin/env python3
"""Checks that docs/ARCHITECTURE.md names only functions, types and files that exist.

The page walks a packet through the code by name; a rename that forgets the page leaves a
newcomer following a ghost. Every backticked `Type::function`, `function` that looks like a
Rust identifier with an underscore, `Type` in CamelCase, and every path ending in .rs must be
found in the workspace's sources. Run from the repository root; exits 1 listing what it could
not find.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SKIP_DIRS = {"target", ".git", "fuzz"}


def sources():
    for p in ROOT.rglob("*.rs"):
        if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts):
            yield p


def main():
    text = "\n".join(p.read_text(errors="replace") for p in sources())
    defined = set(re.findall(r"\b(?:fn|struct|enum|trait|type|mod|const|static)\s+([A-Za-z_][A-Za-z0-9_]*)", text))
    # Enum variants and fields named in the walk (Relayed::Feedback, TestEvent::App).
    defined |= set(re.findall(r"^\s*([A-Z][A-Za-z0-9]*)\s*[({,]", text, re.M))
    defined |= set(re.findall(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?([a-z_][a-z0-9_]*)\s*:", text, re.M))
    doc = DOC.read_text()
    missing = []
    for span in re.findall(r"`([^`]+)`", doc):
        for token in re.split(r"[\s,()]+", span):
            token = token.strip(".;:")
            # Server status counters (`Com_select`) and flags are not code.
            if not token or token.startswith(("--", "Com_")):
                continue
            if token.endswith(".rs") or "/" in token:
                path = token.rstrip("/")
                if any(c in path for c in "{}*"):
                    continue
                candidates = [ROOT / path] + [ROOT / c / path for c in ("core/src", "core/src/engine", "core/src/mysql", "copier/src", "intercept/src", "common/src")]
                if not any(c.exists() for c in candidates):
                    missing.append(token)
                continue
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*", token):
                continue
            last = token.split("::")[-1]
            code_like = "::" in token or "_" in last or re.fullmatch(r"[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*", last)
            if code_like and last not in defined:
                missing.append(token)
    if missing:
        print("docs/ARCHITECTURE.md names what the code does not have:")
        for m in sorted(set(missing)):
            print(f"  {m}")
        return 1
    print("docs/ARCHITECTURE.md: every name it walks through exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
