"""Reads the JUnit reports of llama.cpp's server test suite run against
llama-server and against slotgate-engine (through `adapter.py`) and prints a
Markdown report: passes per test file side by side, then each test that
llama-server passes and slotgate-engine does not, with the first line of why.
Usage: summarize.py LLAMA_SERVER_XML SLOTGATE_XML"""

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def outcomes(path):
    """{(file, test): (passed, reason)} of one run."""
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
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
    print()
    print("Passed by llama-server, not by slotgate-engine:")
    print()
    print("| test | why it failed here |")
    print("|---|---|")
    for key in sorted(theirs):
        if theirs[key][0] and not ours.get(key, (False, "not run"))[0]:
            reason = ours.get(key, (False, "not run"))[1].replace("|", "\\|")
            print(f"| `{key[0]}::{key[1]}` | {reason} |")


if __name__ == "__main__":
    main()
