#!/usr/bin/env python3
"""The product speaks only of itself: fails on words that narrate how the tree was developed.

Scans every tracked file (`git ls-files`; a directory walk outside git) and every file name
for phrases such as "session 8", "issue #10", "four other helpers' builds", "the seed's model",
"the goal was", "development machine" and work tags like `-s8-` in names. Each hit is printed
as `path:line: text`, grouped by top-level directory, and the exit status is 1.

Legitimate uses are left alone: a random seed (`--seed`, "seed corpus"), helper functions,
threads and processes ("a helper thread", "test helper"), a TLS-style "session key".
The patterns are checked against examples of both kinds before the scan (`--self-test` runs
only that), so a pattern that stops matching, or starts matching a legitimate use, fails too.

Usage: product_words.py [ROOT]   (default: the repository this script is in)
"""
import os
import re
import subprocess
import sys

N = r"(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten)"
# Each pattern names what it catches; all are case-insensitive.
PATTERNS = [
    ("session N", rf"\bsessions?\s+#?\d+"),
    ("this/that session", r"\b(?:this|that|each|every|earlier|previous|later|next|last|"
                          r"another|other)\s+sessions?(?:'s|')?(?!\s+(?:key|keys|id|token|cookie|nonce|layer))\b"),
    ("N other sessions", rf"\b{N}\s+(?:other\s+)?sessions\b"),
    ("issue N", r"\bissues?\s*#?\d+"),
    ("the issue's", r"\bthe\s+issue'?s\b"),
    ("finding N", r"\bfindings?\s+\d+\b"),
    ("helpers (who did work)", rf"\bhelpers'|\b(?:other|another|{N})\s+helpers?\b(?!\s+(?:function|thread|process|module|class|script|binar|program|mode|method))"),
    ("a helper did", r"\b(?:a|the|each|every|one|our)\s+helpers?\s+(?:did|worked|wrote|ran|found|measured|merged|reported|added|fixed|built|is\s+working|are\s+working)\b"),
    ("a helper's work", r"\bhelper's\s+(?:worktree|branch|checkout|build|run|session)\b|\bworktrees?\b"),
    ("was merged", r"\b(?:was|were|been|got)\s+merged\b"),
    ("the seed's", r"\bthe\s+seed's\b(?!\s+(?:value|bits|bytes|own\s+rng))"),
    ("seed program", r"\bseed(?:'s)?\s+(?:model|program|script|repo|repository|project|code\s*base|PyTorch|DDP)\b"),
    ("the goal was", r"\b(?:the|our|its)\s+goals?\s+(?:was|were|is\s+met)\b|\bgoals?\s+of\s+(?:the\s+)?issue\b"),
    ("development machine", r"\b(?:development|dev)\s+(?:machine|vm|box|host)s?\b"),
    ("work tag in a name", r"(?:^|[-_/.\s])s\d{1,2}-(?=[a-z0-9]{2})"),
]
COMPILED = [(name, re.compile(rx, re.IGNORECASE)) for name, rx in PATTERNS]

# (text, should it be flagged?): the contract of the patterns above.
EXAMPLES = [
    ("Sanitizers, session 6: both passed", True),
    ("since session 8 the worker runtime's too", True),
    ("run one after the other (sessions 5-7)", True),
    ("after this session's server changes", True),
    ("shared with four other sessions' builds", True),
    ("Warm spare interpreters (issue 14), the pure decisions", True),
    ("Goals (issue #10): step <= 0.9x", True),
    ("## Goals (issue 2)", True),
    ("the issue's two rows", True),
    ("(issue 12, finding 3)", True),
    ("this 2-core box shared with four other helpers' builds", True),
    ("shared with 4 other helpers", True),
    ("a helper measured it on the H200", True),
    ("(0 = the seed's model)", True),
    ("then from a helper's worktree", True),
    ("after the fused step was merged", True),
    ("a 1-rank NCCL run of the seed model under ddprun", True),
    ("the seed program gave the same checksum", True),
    ("the goal was <= 0.5 s", True),
    ("Against the goals of issue #10", True),
    ("on the loaded 2-core development machine", True),
    ("the 2-core development VM", True),
    ("[report](docs/bench/2026-12-01-s6-gpu.md)", True),
    ("branch s9-docs", True),
    # legitimate
    ("--seed N: seed of init, data and shuffles", False),
    ("the seed is the whole RNG state", False),
    ("run the seed corpus and the regressions", False),
    ("sampler = DistributedSampler(data, seed=0)", False),
    ("Test helper: `world` ranks as threads of this process", False),
    ("imports in a helper thread at SCHED_IDLE", False),
    ("A helper process that makes workers die with the agent", False),
    ("Network helpers for the agents", False),
    ("parsing helpers", False),
    ("the engine's state and the helpers stay private to it", False),
    ("a session key derived from both nonces", False),
    ("starts each worker in a session of its own", False),
    ("a 30 s warm-up run plus the seeds", False),
    ("a new session for each worker (setsid)", False),
    ("s1 = [r for r in recs]", False),
    ("const uint32_t s0 = rotr(w[i - 15], 7)", False),
    ("DistributedSampler s3({10, 4, 3, false, 0, false});", False),
    ("see the open issues on the tracker", False),
    ("the development of a loss curve", False),
    ("libs3-dev", False),
    ("the merged environment of the worker", False),
]


def hits_in(text):
    return [name for name, rx in COMPILED if rx.search(text)]


def self_test():
    bad = []
    for text, want in EXAMPLES:
        got = bool(hits_in(text))
        if got != want:
            bad.append(f"  {'missed' if want else 'wrongly flagged'} ({', '.join(hits_in(text)) or '-'}): {text!r}")
    if bad:
        print("product_words.py: the patterns do not meet their examples:\n" + "\n".join(bad))
    return not bad


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, check=True)
        return [p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = []
        skip = {".git", "build", ".venv-torch2", "__pycache__"}
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in skip and not x.startswith("build-")]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return sorted(files)


def main(argv):
    if not self_test():
        return 1
    if argv[1:2] == ["--self-test"]:
        print(f"product_words.py: {len(EXAMPLES)} examples met")
        return 0
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    me = os.path.relpath(os.path.abspath(__file__), root)
    found = []  # (path, line, pattern name, text)
    files = tracked_files(root)
    for rel in files:
        for name in hits_in(rel):
            found.append((rel, 0, name, "(the file name)"))
        if rel == me:
            continue
        path = os.path.join(root, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            continue  # binary (fuzz corpora)
        for i, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            for name in hits_in(line):
                found.append((rel, i, name, line.strip()[:160]))
    if not found:
        print(f"product_words.py: {len(files)} files, no development narrative found")
        return 0
    by_top = {}
    for h in found:
        by_top.setdefault(h[0].split("/")[0] if "/" in h[0] else ".", []).append(h)
    for top in sorted(by_top):
        print(f"== {top}/ ({len(by_top[top])})")
        for rel, line, name, text in by_top[top]:
            print(f"{rel}:{line}: [{name}] {text}")
    print(f"product_words.py: {len(found)} places narrate the development in {len({h[0] for h in found})} "
          "files; say what the product does or measured instead (no sessions, issue numbers, "
          "helpers, 'the seed's', goals, development machines, work tags)")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
