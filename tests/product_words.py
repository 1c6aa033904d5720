#!/usr/bin/env python3
"""The product speaks only of itself: fails on words that narrate how the tree was developed.

Scans every tracked file (`git ls-files`; a directory walk outside git) and every file name
for phrases that narrate development: work periods and ticket numbers, who did the work, the
project's origins, its former goals, the machines it was built on, and work tags in names. Each hit is printed
as `path:line: text`, grouped by top-level directory, and the exit status is 1.

Legitimate uses are left alone: a random seed (`--seed`, "seed corpus"), helper functions,
threads and processes ("a helper thread", "test helper"), a TLS-style "session key".
The patterns are checked against examples of both kinds before the scan (`--self-test` runs
only that), so a pattern that stops matching, or starts matching a legitimate use, fails too.

Usage: product_words.py [ROOT]   (default: the repository this script is in)
"""
import os
import codecs
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
# Phrases the scan must flag, kept in ROT13 so that this file does not itself narrate.
_HITS_ROT13 = [
    'Fnavgvmref, frffvba 6: obgu cnffrq',
    "fvapr frffvba 8 gur jbexre ehagvzr'f gbb",
    'eha bar nsgre gur bgure (frffvbaf 5-7)',
    "nsgre guvf frffvba'f freire punatrf",
    "funerq jvgu sbhe bgure frffvbaf' ohvyqf",
    'Jnez fcner vagrecergref (vffhr 14), gur cher qrpvfvbaf',
    'Tbnyf (vffhr #10): fgrc <= 0.9k',
    '## Tbnyf (vffhr 2)',
    "gur vffhr'f gjb ebjf",
    '(vffhr 12, svaqvat 3)',
    "guvf 2-pber obk funerq jvgu sbhe bgure urycref' ohvyqf",
    'funerq jvgu 4 bgure urycref',
    'n urycre zrnfherq vg ba gur U200',
    "(0 = gur frrq'f zbqry)",
    "gura sebz n urycre'f jbexgerr",
    'nsgre gur shfrq fgrc jnf zretrq',
    'n 1-enax APPY eha bs gur frrq zbqry haqre qqceha',
    'gur frrq cebtenz tnir gur fnzr purpxfhz',
    'gur tbny jnf <= 0.5 f',
    'Ntnvafg gur tbnyf bs vffhr #10',
    'ba gur ybnqrq 2-pber qrirybczrag znpuvar',
    'gur 2-pber qrirybczrag IZ',
    '[ercbeg](qbpf/orapu/2026-12-01-f6-tch.zq)',
    'oenapu f9-qbpf',
]
EXAMPLES = [(codecs.decode(t, "rot13"), True) for t in _HITS_ROT13] + [
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
