#!/usr/bin/env python3
"""The launcher's include graph, checked against its layers (launcher/README.md, "Layout").

Every file of launcher/src/ and launcher/include/ddprun/launcher/ belongs to one layer; a
file may include only its own layer and the layers listed under it in ALLOWED. Also checks
that the headers' include graph has no cycle. Prints the folder-level graph; exits 1 with one
line per violation.
    usage: scripts/check_launcher_layers.py [repo-root]
"""
import os
import re
import sys

ALLOWED = {  # layer -> the layers it may include (besides itself)
    "platform": set(),
    "metrics": {"platform"},
    "options": {"platform"},
    "workers": {"platform", "options"},
    "spares": {"platform", "options", "workers"},
    "group": {"platform", "options", "workers", "spares"},
    "coordination": {"platform", "options", "workers"},
    "observers": {"platform", "options", "workers", "metrics", "status", "hang"},
    "agent": {"platform", "options", "workers", "spares", "group", "coordination", "metrics", "status", "hang",
              "observers"},
    "doctor": {"platform", "options", "workers", "spares"},
    "status": {"platform", "options", "metrics"},
    "hang": {"platform", "options", "workers"},
    "main": {"platform", "options", "workers", "spares", "group", "coordination", "agent", "metrics", "doctor",
             "status", "hang", "observers"},
}
PUBLIC = {  # include/ddprun/launcher/<name> -> layer
    "signal_names.h": "platform", "hostlist.h": "platform", "numa.h": "platform", "env_map.h": "platform", "log_format.h": "platform", "log_events.h": "platform",
    "options.h": "options", "slurm.h": "options", "subcommand_args.h": "options",
    "worker_env.h": "workers", "worker_status.h": "workers", "entrypoint.h": "workers", "process.h": "workers",
    "output.h": "workers", "console.h": "workers", "error_file.h": "workers", "log_paths.h": "workers",
    "worker_files.h": "workers",
    "spare_plan.h": "spares", "agent_metrics.h": "metrics",
    "rendezvous_plan.h": "coordination", "coordinator.h": "coordination",
    "agent_state.h": "agent", "usage_report.h": "observers", "summary.h": "agent", "agent.h": "agent", "launch_plan.h": "agent",
    "doctor.h": "doctor", "json.h": "platform", "runtime_dir.h": "platform",
    "agent_status.h": "status", "status_command.h": "status", "hang.h": "hang",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(rel):
    """rel: a path under launcher/."""
    parts = rel.split("/")
    if parts[0] == "include":
        return PUBLIC.get(parts[-1])
    if rel == "src/main.cpp":
        return "main"
    # The worker group's code drives the warm spares; its header (included by the layers above)
    # does not: it is the workers layer's.
    if parts[1] == "workers" and parts[-1].startswith("worker_group") and parts[-1].endswith(".cpp"):
        return "group"
    return parts[1] if parts[1] in ALLOWED else None


def resolve(inc, root):
    """An include as a path under launcher/, or None when it is not the launcher's."""
    if inc.startswith("ddprun/launcher/"):
        rel = "include/" + inc
    elif "/" in inc and inc.split("/")[0] in ALLOWED:
        rel = "src/" + inc
    else:
        return None
    return rel if os.path.exists(os.path.join(root, rel)) else None


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.join(repo, "launcher")
    files = []
    for top in ("src", "include/ddprun/launcher"):
        for d, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.relpath(os.path.join(d, n), root) for n in names if n.endswith((".h", ".cpp"))]
    errors, edges, folder_edges = [], {}, set()
    for f in sorted(files):
        lf = layer_of(f)
        if lf is None:
            errors.append(f"{f}: in no layer (add it to scripts/check_launcher_layers.py)")
            continue
        with open(os.path.join(root, f)) as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            rel = resolve(inc, root)
            if rel is None:
                continue
            edges.setdefault(f, set()).add(rel)
            lt = layer_of(rel)
            if lt is None:  # reported once, as a file of no layer
                continue
            if lt != lf:
                folder_edges.add((lf, lt))
            if lt != lf and lt not in ALLOWED[lf]:
                errors.append(f"{f} ({lf}) includes {inc} ({lt}): a lower layer may not include a higher one")
    # Cycles among the files (a header that reaches itself).
    state = {}

    def visit(n, path):
        state[n] = 1
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                errors.append("include cycle: " + " -> ".join(path[path.index(m):] + [m]))
            elif m not in state:
                visit(m, path + [m])
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n, [n])
    print(f"{len(files)} files, {sum(len(v) for v in edges.values())} launcher includes; layer -> layers it includes:")
    for lf in ALLOWED:
        print(f"  {lf:13} -> {', '.join(sorted(t for f2, t in folder_edges if f2 == lf)) or '-'}")
    for e in errors:
        print("error: " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
