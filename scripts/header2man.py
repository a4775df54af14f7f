#!/usr/bin/env python3
"""Writes a section-3 manual page as roff from an installed header
(libqcowkit(3) from include/qcowkit/qcowkit.h, libqcowkit-engine(3) from
include/qcowkit/engine.h): the header's opening comment is the
description, and every comment block followed by declarations becomes a
subsection with those declarations and the comment's text, so the manual
says what the header says.

    python3 scripts/header2man.py include/qcowkit/qcowkit.h VERSION > libqcowkit.3
    python3 scripts/header2man.py include/qcowkit/engine.h VERSION > libqcowkit-engine.3
"""
import re
import sys


def esc(line):
    line = line.replace('\\', '\\e').replace('-', '\\-')
    if line.startswith(('.', "'")):
        line = '\\&' + line
    return line


def comment_text(block):
    out = []
    for ln in block.splitlines():
        ln = re.sub(r'^\s*/?\*+/?', '', ln).rstrip()
        if ln.endswith('*/'):
            ln = ln[:-2].rstrip()
        out.append(ln.strip())
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    return out


def main():
    path, version = sys.argv[1], sys.argv[2]
    src = open(path).read()
    # Comments and the code between them, in order.
    parts = re.split(r'(/\*.*?\*/)', src, flags=re.S)
    intro = None
    sections = []  # (comment lines, declarations)
    for i, p in enumerate(parts):
        if not p.startswith('/*'):
            continue
        text = comment_text(p)
        code = parts[i + 1] if i + 1 < len(parts) else ''
        # Declarations: lines up to the next blank line.
        decl = []
        for ln in code.lstrip('\n').splitlines():
            if not ln.strip():
                break
            decl.append(ln.rstrip())
        decl = [d for d in decl if not d.startswith('#if') and not d.startswith('#endif')]
        if intro is None:
            intro = text
            continue
        if not decl or all(d.startswith('#include') for d in decl):
            if text and text[0].startswith('----'):
                sections.append((text, []))
            continue
        sections.append((text, decl))
    names = sorted(set(re.findall(r'\b(qk_[a-z0-9_]+)\(', src)))
    header = path.split('include/')[-1]
    engine = header.endswith('engine.h')
    page = 'libqcowkit-engine' if engine else 'libqcowkit'
    summary = ('the qcowkit engine API: block nodes, coroutines, jobs and the daemon' if engine
               else 'QCOW2 disk-image engine: synchronous and asynchronous image I/O')

    w = sys.stdout.write
    w('.TH %s 3 "" "libqcowkit %s" "Library Functions Manual"\n' % (page.upper(), version))
    # No hyphenation: a function name broken across lines is not findable.
    w('.nh\n')
    w('.SH NAME\n%s \\- %s\n' % (esc(page), summary))
    w('.SH SYNOPSIS\n.nf\n.B #include <%s>\n.PP\n' % header)
    w('cc prog.c $(pkg\\-config \\-\\-cflags \\-\\-libs qcowkit)\n.fi\n')
    w('.PP\nFunctions: ' + ', '.join('\\fB%s\\fR()' % n.replace('_', '_') for n in names) + '.\n')
    w('.SH DESCRIPTION\n')
    for ln in intro:
        w((esc(ln) if ln else '.PP') + '\n')
    for text, decl in sections:
        if text and text[0].startswith('----'):
            w('.SH ' + esc(text[0].strip('- ').upper()) + '\n')
            text = text[1:]
        else:
            w('.PP\n')
        if decl:
            w('.nf\n')
            for d in decl:
                w(esc(d) + '\n')
            w('.fi\n.PP\n')
        for ln in text:
            w((esc(ln) if ln else '.PP') + '\n')
    if engine:
        w('.SH SEE ALSO\n.BR libqcowkit (3),\n.BR qcowkit (1)\n')
        return
    w('.SH ENVIRONMENT\n.TP\n.B QCOWKIT_AIO\nio_uring or threads: the I/O backend of the event loops the '
      'library creates (io_uring by default, falling back to a thread pool).\n.TP\n.B QCOWKIT_URING_ASYNC_MIN, '
      'QCOWKIT_URING_ASYNC_MIN_WRITE, QCOWKIT_URING_WRITER, QCOWKIT_URING_COOP, QCOWKIT_BULK_READ_DIRECT, '
      'QCOWKIT_URING_SUBMIT_BATCH, QCOWKIT_URING_SEQ_MAX\n'
      'The tuning knobs of qk_set_tunable, which a program\'s own setting overrides; qcowkit(1) '
      'describes each.\n')
    w('.SH SEE ALSO\n.BR libqcowkit\\-engine (3),\n.BR qcowkit (1)\n')


main()
