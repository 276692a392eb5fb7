#!/usr/bin/env python3
"""A class's methods live in one file: no class split over sibling .cc files
to stay under the line limit (a class that grows too big gets collaborators).

A method definition here is a line at column 0 naming `Class::method(` (the
house format, clang-format's); constructors and destructors count. Nested
classes count under their own name (`Worker::ControlStream::Run` is
ControlStream's). Tests are not checked. Prints each class defined in more
than one file with its files and exits 1; also fails when nothing is found
(the pattern broke).
"""
import collections
import pathlib
import re
import sys

DEFINITION = re.compile(r'^[A-Za-z_][^()=;]*?\b([A-Z][A-Za-z0-9_]*)::(~?[A-Za-z_][A-Za-z0-9_]*)\(')
FOLDERS = ('coordinator', 'worker', 'services', 'clients')


def main():
    root = pathlib.Path(sys.argv[1])
    files = collections.defaultdict(set)
    for folder in FOLDERS:
        for path in sorted((root / folder).glob('**/*.cc')):
            for line in path.read_text().split('\n'):
                match = DEFINITION.match(line)
                if match:
                    files[match.group(1)].add(str(path.relative_to(root)))
    spread = {cls: sorted(where) for cls, where in files.items() if len(where) > 1}
    for cls in sorted(spread):
        print(f'{cls}: methods defined in {len(spread[cls])} files: {", ".join(spread[cls])}')
    print(f'{len(files)} classes checked, {len(spread)} spread over several files')
    return 1 if spread or not files else 0

if __name__ == '__main__':
    sys.exit(main())
