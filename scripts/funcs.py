#!/usr/bin/env python3
"""Function lengths in C files: a top-level definition starts at a line at column 0 that is not a
comment/preprocessor/declaration ending in ';' and whose body '{' opens at depth 0; its length is
lines from the signature's first line to the closing '}'. Usage: scripts/funcs.py FILES... (prints the
longest, the count over 80, and totals)."""
import sys, re, signal
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
res = []
for path in sys.argv[1:]:
    src = open(path, errors='replace').read()
    # blank out comments and strings, keep newlines
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('/*', i):
            j = src.find('*/', i + 2); j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', src[i:j])); i = j
        elif src.startswith('//', i):
            j = src.find('\n', i); j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif c in '"\'':
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == '\\' else 1
            out.append(c + ' ' * (j - i - 1) + c if j < n else src[i:]); i = j + 1
        else:
            out.append(c); i += 1
    text = ''.join(out)
    lines = text.split('\n')
    depth, start, name = 0, None, None
    sig_start = None
    for ln, line in enumerate(lines):
        s = line.strip()
        if depth == 0:
            if s.startswith('#'): sig_start = None; continue
            if sig_start is None and line[:1] not in (' ', '\t', '') and not s.startswith('}'):
                sig_start = ln
            if s.endswith(';') and '{' not in s: sig_start = None
        for ch in line:
            if ch == '{':
                if depth == 0 and sig_start is not None:
                    sig = ' '.join(lines[sig_start:ln + 1])
                    m = re.search(r'(\w+)\s*\([^()]*(\([^()]*\)[^()]*)*\)\s*\{', sig)
                    if m and '=' not in sig.split('(')[0]:
                        start, name = sig_start, m.group(1)
                depth += 1
            elif ch == '}':
                depth -= 1
                if depth == 0:
                    if start is not None:
                        res.append((ln - start + 1, path, name))
                    start, sig_start = None, None
res.sort(reverse=True)
over = [r for r in res if r[0] > 80]
print(f"{len(res)} functions, {len(over)} over 80 lines")
for r in res[:12]: print(f"  {r[0]:4d} {r[1]} {r[2]}")
