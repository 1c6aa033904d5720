#!/usr/bin/env python3
"""Layering below the launcher (scripts/check_launcher_layers.py checks the launcher's own).

1. CMake targets of rendezvous/, launcher/ and worker_runtime/: the link graph has no cycle, no
   target reaches (through any chain of links) a target listed under it in MUST_NOT_REACH, and
   the libraries in SOURCES_UNDER take their sources from their own folders only.
2. worker_runtime's include graph: every file of src/ and include/ddprun/worker/ is in one
   layer of WORKER_ALLOWED and includes only its own layer and those under it; no cycle; and
   each exported free function (DDPRUN_WORKER_API) is defined in a source of its header's layer.
Prints a summary; exits 1 with one line per violation, saying what to change.
    usage: scripts/check_layers.py [repo-root]
"""
import os
import re
import sys

CMAKE_DIRS = ("rendezvous", "launcher", "worker_runtime", "worker_runtime/torch")
PURE = ("ddprun_store_server", "ddprun_store_client", "ddprun_rdzv_client", "ddprun_rdzv_io", "ddprun_relay",
        "ddprun_metrics", "ddprun_metrics_endpoint", "ddprun_launcher")
MUST_NOT_REACH = {  # target -> targets it may not link, directly or not
    "ddprun_wire": PURE + ("ddprun_store_state", "ddprun_rdzv_state"),
    "ddprun_store_state": PURE,
    "ddprun_rdzv_state": PURE,
    "ddprun_metrics_builders": PURE,
    "ddprun_launcher_core": PURE,  # pure: no sockets, no threads
    "ddprun_store_client": ("ddprun_store_server", "ddprun_rdzv_client", "ddprun_rdzv_io", "ddprun_launcher",
                            "ddprun_metrics"),
    "ddprun_relay": ("ddprun_store_server", "ddprun_rdzv_client", "ddprun_launcher"),
    "ddprun_store_server": ("ddprun_store_client", "ddprun_rdzv_client", "ddprun_launcher", "ddprun_metrics"),
    "ddprun_worker": ("ddprun_rdzv_client", "ddprun_launcher", "ddprun_launcher_core", "ddprun_metrics"),
}
SOURCES_UNDER = {  # library -> the only folders (under its CMakeLists.txt's) its sources may lie in
    "ddprun_wire": ("src/wire/",), "ddprun_store_state": ("src/store/",), "ddprun_rdzv_state": ("src/rdzv/",),
    "ddprun_store_client": ("src/client/",), "ddprun_store_server": ("src/server/",),
    "ddprun_relay": ("src/relay/",), "ddprun_metrics_builders": ("src/metrics/",), "ddprun_rdzv_io": ("src/rdzv_io/",),
}

WORKER_ALLOWED = {  # layer -> the layers it may include (besides itself)
    "base": set(),
    "store": {"base"},
    "comm": {"base", "store"},
    "train": {"base", "store", "comm"},
    "runtime": {"base", "store", "comm", "train"},
}
WORKER_LAYER = {  # file stem -> layer; src/gpu/* is "comm"
    "export": "base", "checks": "base", "dtype": "base", "hash": "base", "env": "base", "error_file": "base",
    "log": "base", "half": "base", "knob_flag": "base", "stream_timing": "base", "progress": "base",
    "progress_page": "base",
    "store": "store", "store_impl": "store",
    "communicator": "comm", "collective_check": "comm", "gloo_communicator": "comm", "position_board": "comm",
    "shm_allreduce": "comm", "shm_control": "comm", "shm_segment": "comm", "gpu_backend": "comm",
    "gpu_stub": "comm", "gpu_checks": "comm",
    "reducer": "train", "reducer_impl": "train", "reducer_step": "train", "checkpoint": "train", "stop": "train",
    "sampler": "train",
    "runtime": "runtime",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
CALL = re.compile(r"\b(add_library|add_executable|target_link_libraries|target_sources)\s*\(([^)]*)\)", re.S)
API_FN = re.compile(r"^(?:\[\[noreturn\]\]\s*)?DDPRUN_WORKER_API\s+(?!class\b|struct\b)[^(;=]*?\b(\w+)\s*\(", re.M)


def strip_comments(text):
    return re.sub(r"#[^\n]*", "", text)


def cmake_graph(repo):
    """({target: set(linked)}, {target: [(cmake dir, source)]}), aliases resolved."""
    links, sources, alias = {}, {}, {}
    for d in CMAKE_DIRS:
        path = os.path.join(repo, d, "CMakeLists.txt")
        if not os.path.exists(path):
            continue
        with open(path) as fh:
            text = strip_comments(fh.read())
        for cmd, args in CALL.findall(text):
            words = args.split()
            if not words:
                continue
            name = words[0]
            if cmd == "add_library" and len(words) >= 3 and words[1] == "ALIAS":
                alias[name] = words[2]
                continue
            if cmd in ("add_library", "add_executable", "target_sources"):
                links.setdefault(name, set())
                srcs = [w for w in words[1:] if w.endswith((".cpp", ".cu", ".c"))]
                sources.setdefault(name, []).extend((d, s) for s in srcs)
            else:
                names = re.findall(r"ddprun::\w+|ddprun_\w+|\bdprun\w*", " ".join(words[1:]))
                links.setdefault(name, set()).update(names)
    return {t: {alias.get(x, x) for x in v} for t, v in links.items()}, sources


def check_targets(repo, errors):
    links, sources = cmake_graph(repo)

    def reach(t, seen):
        for m in links.get(t, ()):
            if m not in seen:
                seen.add(m)
                reach(m, seen)
        return seen

    for t, banned in MUST_NOT_REACH.items():
        if t not in links:
            errors.append(f"target {t}: not found in {', '.join(CMAKE_DIRS)} (update scripts/check_layers.py)")
            continue
        for b in sorted(reach(t, set()) & set(banned)):
            errors.append(f"target {t} links {b} (directly or through another target): a lower layer may not "
                          f"link a higher one; move the code it needs down, or link {b} where it is used")
    for t, folders in SOURCES_UNDER.items():
        for d, s in sources.get(t, []):
            if not s.startswith(folders):
                errors.append(f"target {t} ({d}/CMakeLists.txt) compiles {s}, outside {', '.join(folders)}: give it "
                              "a target of its own (or the one of its folder)")
    cycle = find_cycle(links)
    if cycle:
        errors.append("target link cycle: " + " -> ".join(cycle))
    return len(links)


def find_cycle(edges):
    state = {}

    def visit(n, path):
        state[n] = 1
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m, path + [m])
                if found:
                    return found
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n, [n])
            if found:
                return found
    return None


def worker_layer(rel):
    stem = os.path.splitext(os.path.basename(rel))[0]
    if rel.startswith("src/gpu/"):
        return "comm"
    return WORKER_LAYER.get(stem)


def worker_resolve(inc, rel, root):
    cands = ["include/" + inc] if inc.startswith("ddprun/worker/") else [
        os.path.normpath(os.path.join(os.path.dirname(rel), inc)), "src/" + inc, "src/gpu/" + inc]
    for c in cands:
        if os.path.exists(os.path.join(root, c)):
            return c
    return None


def defined_in(text, name):
    """Whether `text` defines a free function `name` at namespace scope (a line that starts it)."""
    for m in re.finditer(r"^(?![ \t/#])[^\n;{}()]*(?<!::)\b" + name + r"\(", text, re.M):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        rest = text[i:i + 80].lstrip()
        rest = re.sub(r"^(const|noexcept|override)\b\s*", "", rest)
        if rest.startswith("{"):
            return True
    return False


def check_worker(repo, errors):
    root = os.path.join(repo, "worker_runtime")
    files = []
    for top in ("src", "include/ddprun/worker"):
        for d, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith((".h", ".cpp", ".cu"))]
    texts, edges = {}, {}
    for f in sorted(files):
        with open(os.path.join(root, f)) as fh:
            texts[f] = fh.read()
        lf = worker_layer(f)
        if lf is None:
            errors.append(f"worker_runtime/{f}: in no layer (add it to WORKER_LAYER in scripts/check_layers.py)")
            continue
        for inc in INCLUDE.findall(texts[f]):
            rel = worker_resolve(inc, f, root)
            if rel is None:
                continue
            edges.setdefault(f, set()).add(rel)
            lt = worker_layer(rel)
            if lt and lt != lf and lt not in WORKER_ALLOWED[lf]:
                errors.append(f"worker_runtime/{f} ({lf}) includes {inc} ({lt}): a lower layer may not include a "
                              "higher one")
    cycle = find_cycle(edges)
    if cycle:
        errors.append("worker_runtime include cycle: " + " -> ".join(cycle))
    apis = 0
    for h in (f for f in sorted(files) if f.endswith(".h")):
        for name in sorted(set(API_FN.findall(texts[h]))):
            apis += 1
            homes = [f for f in files if f.endswith((".cpp", ".cu")) and defined_in(texts[f], name)]
            for f in homes:
                if worker_layer(f) != worker_layer(h):
                    errors.append(f"worker_runtime: {name}() is declared in {h} ({worker_layer(h)}) but defined in "
                                  f"{f} ({worker_layer(f)}): define it in a source of its header's layer")
    return len(files), apis


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    errors = []
    targets = check_targets(repo, errors)
    files, apis = check_worker(repo, errors)
    print(f"{targets} CMake targets; worker_runtime: {files} files, {apis} exported functions")
    for e in errors:
        print("error: " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
