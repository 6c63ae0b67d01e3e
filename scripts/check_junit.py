"""Fail when the test run executed no test or skipped any (a skipped backend test counts as failing)."""

import sys
import xml.etree.ElementTree as ET

tests = 0
skipped = []
for path in sys.argv[1:]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests += sum(int(s.get("tests", 0)) for s in suites)
    skipped += [
        f"{case.get('classname')}::{case.get('name')}"
        for case in root.iter("testcase")
        if case.find("skipped") is not None
    ]
if tests == 0:
    print("check_junit: pytest ran no test", file=sys.stderr)
    sys.exit(1)
if skipped:
    print(f"check_junit: {len(skipped)} skipped test(s) count as failing:", file=sys.stderr)
    for s in skipped:
        print(f"  {s}", file=sys.stderr)
    sys.exit(1)
print(f"check_junit: {tests} tests, none skipped")
