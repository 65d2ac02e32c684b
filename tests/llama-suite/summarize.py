"""Reads the JUnit reports of llama.cpp's server test suite run against
llama-server and against slotgate-engine (through `adapter.py`) and prints a
Markdown report: passes per test file side by side, the count that matters
(llama-server's passes less those of what slotgate refuses on purpose, listed
in `refused.txt`), then each test that llama-server passes and slotgate-engine
does not, with the first line of why or the reason it is refused.
Usage: summarize.py LLAMA_SERVER_XML[,XML...] SLOTGATE_XML[,XML...]"""

import pathlib
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

REFUSED = pathlib.Path(__file__).with_name("refused.txt")


def refused():
    """[(prefix, why)] of the tests of features refused on purpose."""
    out = []
    for line in REFUSED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            prefix, why = line.split(" | ", 1)
            out.append((prefix.strip(), why.strip()))
    return out


def refusal(key, rules):
    name = f"{key[0]}::{key[1]}"
    return next((why for prefix, why in rules if name.startswith(prefix)), None)


def outcomes(paths):
    """{(file, test): (passed, reason)} of one run, from its reports."""
    found = {}
    cases = (c for p in paths.split(",") for c in ET.parse(p).getroot().iter("testcase"))
    for case in cases:
        file = case.get("classname", "").split(".")[-1]
        name = case.get("name", "")
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skipped = case.find("skipped") is not None
        reason = "" if bad is None else (bad.get("message") or "").splitlines()[0][:160]
        found[(file, name)] = (bad is None and not skipped, "skipped" if skipped else reason)
    return found


def main() -> None:
    theirs, ours = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    files = defaultdict(lambda: [0, 0, 0])
    for key in theirs.keys() | ours.keys():
        counts = files[key[0]]
        counts[0] += 1
        counts[1] += theirs.get(key, (False, ""))[0]
        counts[2] += ours.get(key, (False, ""))[0]
    total = [sum(c[i] for c in files.values()) for i in range(3)]
    print("| file | tests | llama-server passes | slotgate-engine passes |")
    print("|---|---|---|---|")
    for file in sorted(files):
        n, a, b = files[file]
        print(f"| `{file}` | {n} | {a} | {b} |")
    print(f"| **all** | **{total[0]}** | **{total[1]}** | **{total[2]}** |")
    rules = refused()
    passed = [k for k in theirs if theirs[k][0]]
    apart = [k for k in passed if refusal(k, rules)]
    ours_apart = [k for k in apart if ours.get(k, (False, ""))[0]]
    print()
    print(f"Of llama-server's {total[1]} passes, {len(apart)} test what slotgate-engine "
          "refuses on purpose (the README's list; `tests/llama-suite/refused.txt`): "
          f"**{total[1] - len(apart)}** to match. slotgate-engine passes "
          f"**{total[2] - len(ours_apart)}** of the tests not refused.")
    print()
    print("Passed by llama-server, not by slotgate-engine:")
    print()
    print("| test | why it failed here |")
    print("|---|---|")
    for key in sorted(passed):
        if not ours.get(key, (False, "not run"))[0]:
            why = refusal(key, rules)
            reason = f"refused on purpose: {why}" if why else ours.get(key, (False, "not run"))[1]
            reason = reason.replace("|", "\\|")
            print(f"| `{key[0]}::{key[1]}` | {reason} |")


if __name__ == "__main__":
    main()
