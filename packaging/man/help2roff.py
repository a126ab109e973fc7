#!/usr/bin/env python3
"""help2roff.py: writes starling's man pages from its --help texts.

The build runs it once `starling` is linked (CMakeLists.txt, the install
block), so that the pages say what the binary says and never drift:

    packaging/man/help2roff.py --starling build/starling --out build/man \
        --version 0.1.0

It writes starling.1 from `starling --help` (the command list) and one
starling-CMD.1 per command from `starling CMD --help`, like git's pages.
The --help texts follow one layout (tools/cli/), read here as:

- `usage: starling CMD ...` and its indented continuation lines, one usage
  per line that starts with `starling`: the SYNOPSIS;
- paragraphs at column 0: the DESCRIPTION;
- a line at column 0 ending in `:` (`Cluster:`): a heading; its option
  lines (`  --flag ARG   what it does`, continued on lines indented to the
  description's column) become the OPTIONS, one .TP each;
- a heading starting with `Example`: kept verbatim under EXAMPLES.

Help2man (Debian's help2man) reads the same texts, but takes
`usage:` in lower case for prose and needs one executable per command;
this is short enough to own. Exits 0, or 1 naming the command whose
--help failed.
"""
import argparse
import os
import re
import subprocess
import sys
import time

OPTION = re.compile(r"^( {1,6})(-\S.*)$")
HEADING = re.compile(r"^\S.*:$")


def esc(text):
    """Escapes text for roff: backslashes, hyphens, and a leading . or '."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def run_help(starling, args):
    """The --help text of `starling ARGS`, or exits naming the command."""
    cmd = [starling] + args + ["--help"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.exit("help2roff: %s: %s" % (" ".join(cmd), e))
    if out.returncode != 0:
        sys.exit("help2roff: `%s` exited %d: %s"
                 % (" ".join(cmd), out.returncode, out.stderr.strip()))
    return out.stdout


def split_usage(lines):
    """Splits off the leading usage block: (usages, rest of the lines)."""
    if not lines or not lines[0].startswith("usage:"):
        return [], lines
    usages = [lines[0][len("usage:"):].strip()]
    i = 1
    while i < len(lines) and lines[i].startswith(" ") and lines[i].strip():
        part = lines[i].strip()
        if part.startswith("starling "):
            usages.append(part)
        else:
            usages[-1] += " " + part
        i += 1
    return usages, lines[i:]


def option_items(block):
    """Option lines and their continuations in BLOCK: [(term, desc)].

    The description starts after a run of two spaces; where an option is
    too long to leave two (`--checkpoint-every S write ...`), at the
    column its neighbours' descriptions start."""
    cols = []
    for line in block:
        m = re.match(r"^( {1,6}-\S.*?\s{2,})\S", line)
        if m:
            cols.append(len(m.group(1)))
    col = max(set(cols), key=cols.count) if cols else 0
    items = []
    for line in block:
        m = OPTION.match(line)
        if m and (not items or len(m.group(1)) < col or col == 0):
            parts = re.split(r"\s{2,}", m.group(2), maxsplit=1)
            if len(parts) == 1 and col and len(line) > col and \
                    line[col - 1] == " ":
                parts = [line[:col].strip(), line[col:].strip()]
            items.append([parts[0], parts[1] if len(parts) > 1 else ""])
        elif items:
            items[-1][1] = (items[-1][1] + " " + line.strip()).strip()
    return items


def split_prose(lines):
    """Splits LINES into prose (column 0) and option lines with their
    indented continuations: (prose, options)."""
    prose, opts, in_opts = [], [], False
    for line in lines:
        in_opts = bool(OPTION.match(line)) or (in_opts and (
            line.startswith(" ") or not line.strip()))
        (opts if in_opts else prose).append(line)
    return prose, [l for l in opts if l.strip()]


def sections(lines):
    """Groups lines into (heading, lines) with heading None at the top."""
    out = [[None, []]]
    for line in lines:
        if HEADING.match(line):
            out.append([line[:-1], []])
        else:
            out[-1][1].append(line)
    return out


def paragraphs(lines):
    """Roff for prose: blank lines separate paragraphs."""
    out, para = [], []
    for line in lines + [""]:
        if line.strip():
            para.append(line.strip())
        elif para:
            out += [".PP", esc(" ".join(para))]
            para = []
    return out


def verbatim(lines):
    body = [esc(line) for line in lines]
    while body and not body[-1].strip():
        body.pop()
    return [".PP", ".nf", ".RS 4"] + body + [".RE", ".fi"] if body else []


def header(name, summary, version):
    date = ""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        date = time.strftime(
            "%Y-%m-%d", time.gmtime(int(os.environ["SOURCE_DATE_EPOCH"])))
    return ['.\\" Generated from `%s --help` by packaging/man/help2roff.py.'
            % name.replace("-", " ", 1),
            '.TH %s 1 "%s" "starling %s" "starling manual"'
            % (esc(name.upper()), date, version),
            ".nh", ".ad l",
            ".SH NAME", "%s \\- %s" % (esc(name), esc(summary))]


def command_page(name, summary, text, version):
    """The roff of starling-NAME(1) from its --help TEXT."""
    out = header("starling-" + name, summary, version)
    usages, rest = split_usage(text.rstrip("\n").split("\n"))
    if usages:
        out.append(".SH SYNOPSIS")
        for k, u in enumerate(usages):
            words = u.split(" ", 2)
            out += ([".br"] if k else []) + \
                [".B %s" % esc(" ".join(words[:2])),
                 esc(words[2]) if len(words) > 2 else ""]
    options, examples = [], []
    for heading, body in sections(rest):
        if heading is None:
            prose, opts = split_prose(body)
            if any(l.strip() for l in prose):
                out += [".SH DESCRIPTION"] + paragraphs(prose)
            items = option_items(opts)
            options += [(None, items)] if items else []
        elif heading.startswith("Example"):
            examples += ([".PP", esc(heading) + ":"] if
                         heading != "Example" else []) + verbatim(body)
        else:
            options.append((heading, option_items(body)))
    if options:
        out.append(".SH OPTIONS")
        for heading, items in options:
            if heading:
                out.append(".SS %s" % esc(heading))
            for term, desc in items:
                out += [".TP", "\\fB%s\\fR" % esc(term), esc(desc)]
    if examples:
        out += [".SH EXAMPLES"] + examples
    out += [".SH SEE ALSO", "\\fBstarling\\fR(1)"]
    return "\n".join(out) + "\n"


def command_list(text):
    """[(name, summary)] from the `  name   summary` lines of starling --help."""
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^  ([a-z][a-z0-9-]*)\s{2,}(.+)$", text, re.M)]


def main_page(text, commands, version):
    out = header("starling", "peer-to-peer training with local SGD and "
                 "gossip averaging", version)
    out += [".SH SYNOPSIS", ".B starling", "\\fIcommand\\fR [\\fIoptions\\fR]",
            ".SH DESCRIPTION"]
    prose = [re.sub(r"\s*Commands:$", "", l) for l in text.split("\n")[1:]
             if not l.startswith("  ") and not l.startswith("Run ")]
    out += paragraphs(prose)
    out.append(".SH COMMANDS")
    for name, summary in commands:
        out += [".TP", "\\fB%s\\fR" % esc(name),
                "%s; see \\fBstarling\\-%s\\fR(1)." % (esc(summary), esc(name))]
    out += [".SH SEE ALSO",
            ", ".join("\\fBstarling\\-%s\\fR(1)" % esc(n) for n, _ in commands),
            ".PP", "The guides under /usr/share/doc/starling, or docs/ in "
            "the source tree: operations.md, training.md, attach.md."]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starling", required=True, help="the starling binary")
    ap.add_argument("--out", required=True, help="directory for the pages")
    ap.add_argument("--version", required=True, help="version for the header")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    top = run_help(args.starling, [])
    commands = command_list(top)
    if not commands:
        sys.exit("help2roff: `%s --help` lists no commands" % args.starling)
    pages = {"starling.1": main_page(top, commands, args.version)}
    for name, summary in commands:
        text = run_help(args.starling, [name])
        pages["starling-%s.1" % name] = command_page(name, summary, text,
                                                     args.version)
    for old in os.listdir(args.out):
        if old.endswith(".1") and old not in pages:
            os.remove(os.path.join(args.out, old))
    for fname, roff in pages.items():
        with open(os.path.join(args.out, fname), "w") as f:
            f.write(roff)
    print("help2roff: %d pages in %s" % (len(pages), args.out))


if __name__ == "__main__":
    main()
