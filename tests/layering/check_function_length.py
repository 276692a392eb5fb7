#!/usr/bin/env python3
"""No function in clients/, worker/, coordinator/, services/ or a binary's main.cc
longer than 150 lines.

A function here is a definition that starts at column 0 and ends at the next
line holding only "}" (the house format, clang-format's); methods defined
inside a class body are indented and counted with their class's file, not
here. Prints each offender and exits 1.
"""
import pathlib
import re
import sys

LIMIT = 150
HEAD = re.compile(r'^[A-Za-z_].*\)\s*(const\s*)?(override\s*)?(noexcept\s*)?\{$')


def long_functions(path):
    start = None
    for number, line in enumerate(path.read_text().split('\n'), 1):
        if start is None:
            if HEAD.match(line) and not line.startswith(('namespace', 'struct', 'class', 'enum')):
                start, head = number, line
        elif line == '}':
            if number - start + 1 > LIMIT:
                yield start, number - start + 1, head
            start = None


def main():
    root = pathlib.Path(sys.argv[1])
    files = sorted(root.glob('clients/**/*.cc')) + sorted(root.glob('*/main.cc'))
    for folder in ('worker', 'coordinator', 'services'):
        files += sorted(p for p in root.glob(f'{folder}/**/*.cc') if p.name != 'main.cc')
    bad = 0
    for path in files:
        for line, length, head in long_functions(path):
            print(f'{path.relative_to(root)}:{line}: {length} lines (limit {LIMIT}): {head}')
            bad += 1
    print(f'{len(files)} files checked, {bad} functions over {LIMIT} lines')
    return 1 if bad or not files else 0


if __name__ == '__main__':
    sys.exit(main())
