#!/usr/bin/env python3
"""md2roff.py: rankmem's man page sources (man/*.md) to roff (man macros).

    md2roff.py [--version V] [--options src/options.c] PAGE.md > PAGE.N

The sources use a small subset of Markdown, written for man pages; see
man/README.md. Block syntax:

  line 1           `name(N) -- what it is`: the .TH line and the NAME section
  `names: a, b`    (optional line 2) the names the NAME section lists
  `# TITLE`        a section (.SH); `## Title`: a subsection (.SS)
  blank line       a new paragraph
  ```              fenced code, printed as is, indented (.nf)
  `- text`         a bullet item; continuation lines are indented by 2
  `term` + `: def` a tagged paragraph (.TP): a line, then lines starting
                   with ": " (the definition; continuation lines indented by 2)
  `@OPTIONS@`      (alone on a line) the RANKMEM_* options read from the
                   option table in src/options.c (--options), as tagged
                   paragraphs: the list in rankmem(7) cannot drift from the code
Inline: `code` is bold, *word* italic, **word** bold, \\* \\` \\\\ are the
characters themselves; roff's own backslashes and leading dots are
escaped. No tables (they would need tbl)."""

import argparse
import datetime
import os
import re
import sys


class PageError(Exception):
    pass


# ---- the option table of src/options.c -----------------------------------

def c_tokens(text):
    """Tokens of a C initialiser: string literals (adjacent ones joined),
    identifiers, and punctuation; comments are skipped."""
    pos = 0
    out = []
    token_re = re.compile(r'\s+|/\*.*?\*/|//[^\n]*|"((?:[^"\\\n]|\\.)*)"|([A-Za-z_]\w*)|(.)', re.S)
    while pos < len(text):
        m = token_re.match(text, pos)
        pos = m.end()
        if m.group(1) is not None:
            s = bytes(m.group(1), "utf-8").decode("unicode_escape")
            if out and out[-1][0] == "str":
                out[-1] = ("str", out[-1][1] + s)
            else:
                out.append(("str", s))
        elif m.group(2) is not None:
            out.append(("id", m.group(2)))
        elif m.group(3) is not None:
            out.append(("punct", m.group(3)))
    return out


def read_options(path):
    """[(name, type, default, help, choices)] from the defs[] table."""
    with open(path, encoding="utf-8") as f:
        src = f.read()
    m = re.search(r"\bdefs\s*\[\s*\]\s*=\s*\{(.*?)\n\};", src, re.S)
    if not m:
        raise PageError("%s: no option table (static const option_def_t defs[] = {...};)" % path)
    toks = c_tokens(m.group(1))
    options = []
    depth = 0
    fields = []
    cur = None
    for kind, val in toks:
        if kind == "punct" and val == "{":
            depth += 1
            if depth == 1:
                fields, cur = [], None
            continue
        if kind == "punct" and val == "}":
            if depth == 1:
                if cur is not None:
                    fields.append(cur)
                if len(fields) < 5:
                    raise PageError("%s: an option entry with %d fields" % (path, len(fields)))
                options.append(fields[:5])
            depth -= 1
            continue
        if depth != 1:
            continue
        if kind == "punct" and val == ",":
            fields.append(cur)
            cur = None
        else:
            cur = val
    for o in options:
        if not (isinstance(o[0], str) and o[0].startswith("RANKMEM_")):
            raise PageError("%s: unexpected option name %r" % (path, o[0]))
    if not options:
        raise PageError("%s: the option table is empty" % path)
    return options


TYPE_WORDS = {
    "RANKMEM_OPTION_STRING": "string",
    "RANKMEM_OPTION_SIZE": "size",
    "RANKMEM_OPTION_BOOL": "boolean",
    "RANKMEM_OPTION_ENUM": "one of a list",
    "RANKMEM_OPTION_LIST": "comma-separated list",
    "RANKMEM_OPTION_INT": "integer",
}


def options_markup(options):
    """The options as tagged paragraphs, in this script's own markup."""
    lines = []
    for name, typ, default, helptext, choices in options:
        what = TYPE_WORDS.get(typ, "value")
        lines.append("`%s`" % name)
        desc = helptext
        desc = re.sub(r"([*`\\])", r"\\\1", desc)  # literal, not markup
        if not desc.endswith("."):
            desc += "."
        extra = "Type: %s" % what
        if choices and choices != "NULL":
            words = [w if w else "(empty)" for w in choices.split("|")]
            extra += " (%s)" % ", ".join("`%s`" % w if w != "(empty)" else w for w in words)
        extra += "; default: " + ("`%s`" % default if default else "empty") + "."
        lines.append(": " + desc + " " + extra)
        lines.append("")
    return lines


# ---- inline markup ---------------------------------------------------------

def escape(text):
    """Characters roff would read as requests or escapes."""
    text = text.replace("\\", "\\e")
    return text


def code_text(text):
    """Literal text: escaped, '-' as a minus sign (copyable, never a line
    break point)."""
    return escape(text).replace("-", "\\-").replace("'", "\\(aq").replace("`", "\\(ga")


INLINE_RE = re.compile(r"\\([*`\\])|`([^`]+)`|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*")


# A reference to a page, name(N): the name in bold, never broken at a hyphen.
REF_RE = re.compile(r"(?<![\w.-])([a-z][a-z0-9_.-]*[a-z0-9_])\(([1-8])\)")


def plain(text):
    out = []
    pos = 0
    for m in REF_RE.finditer(text):
        out.append(escape(text[pos:m.start()]))
        out.append("\\fB" + code_text(m.group(1)) + "\\fR(" + m.group(2) + ")")
        pos = m.end()
    out.append(escape(text[pos:]))
    return "".join(out)


def inline(text):
    out = []
    pos = 0
    for m in INLINE_RE.finditer(text):
        out.append(plain(text[pos:m.start()]))
        if m.group(1) is not None:
            out.append(escape(m.group(1)))
        elif m.group(2) is not None:
            out.append("\\fB" + code_text(m.group(2)) + "\\fR")
        elif m.group(3) is not None:
            out.append("\\fB" + escape(m.group(3)) + "\\fR")
        else:
            out.append("\\fI" + escape(m.group(4)) + "\\fR")
        pos = m.end()
    out.append(plain(text[pos:]))
    line = "".join(out)
    if line.startswith(".") or line.startswith("'"):
        line = "\\&" + line
    return line


def text_lines(lines):
    """Running text: one roff line per source line, inline markup done."""
    return [inline(l.strip()) for l in lines if l.strip()]


# ---- blocks ------------------------------------------------------------------

HEAD_RE = re.compile(r"^([A-Za-z0-9_.+-]+)\(([1-8])\)\s+--\s+(.+)$")


def convert(src_lines, version, date, options_path, where):
    if not src_lines:
        raise PageError("%s: empty page" % where)
    m = HEAD_RE.match(src_lines[0].strip())
    if not m:
        raise PageError("%s:1: expected 'name(N) -- description'" % where)
    name, section, desc = m.groups()
    body = src_lines[1:]
    names = name
    if body and body[0].startswith("names:"):
        names = body[0][len("names:"):].strip()
        body = body[1:]
    out = [
        '.\\" Generated by man/md2roff.py from %s; edit that file, not this one.' % os.path.basename(where),
        '.TH "%s" "%s" "%s" "rankmem %s" "rankmem manual"' % (name.upper(), section, date, version),
        ".nh",
        ".ad l",
        ".SH NAME",
        "%s \\- %s" % (escape(names), escape(desc)),
    ]
    i = 0
    n = len(body)
    para_open = False  # a paragraph has text after the last block break

    def need_break():
        nonlocal para_open
        if para_open:
            out.append(".PP")
        para_open = False

    while i < n:
        line = body[i].rstrip("\n")
        stripped = line.strip()
        if not stripped:
            i += 1
            if para_open:
                para_open = "break"
            continue
        if stripped == "@OPTIONS@":
            if not options_path:
                raise PageError("%s:%d: @OPTIONS@ needs --options src/options.c" % (where, i + 2))
            body[i:i + 1] = options_markup(read_options(options_path))
            n = len(body)
            continue
        if stripped.startswith("```"):
            j = i + 1
            code = []
            while j < n and not body[j].strip().startswith("```"):
                code.append(body[j].rstrip("\n"))
                j += 1
            if j >= n:
                raise PageError("%s:%d: unclosed code block" % (where, i + 2))
            if para_open:
                out.append(".PP")
            out.append(".RS 4")
            out.append(".nf")
            for c in code:
                c = escape(c)
                if c.startswith(".") or c.startswith("'"):
                    c = "\\&" + c
                out.append(c if c else "")
            out.append(".fi")
            out.append(".RE")
            para_open = "break"
            i = j + 1
            continue
        if stripped.startswith("## "):
            out.append(".SS " + inline(stripped[3:]).replace('"', "\\(dq"))
            para_open = False
            i += 1
            continue
        if stripped.startswith("# "):
            out.append(".SH " + inline(stripped[2:].upper()).replace('"', "\\(dq"))
            para_open = False
            i += 1
            continue
        if stripped.startswith("- "):
            item = [stripped[2:]]
            j = i + 1
            while j < n and body[j].startswith("  ") and body[j].strip():
                item.append(body[j])
                j += 1
            out.append(".IP \\(bu 2")
            out.extend(text_lines(item))
            para_open = "list"
            i = j
            continue
        if i + 1 < n and body[i + 1].startswith(": "):
            out.append(".TP")
            out.append(inline(stripped))
            item = [body[i + 1][2:]]
            j = i + 2
            while j < n and body[j].startswith("  ") and body[j].strip():
                item.append(body[j])
                j += 1
            out.extend(text_lines(item))
            para_open = "list"
            i = j
            continue
        if stripped.startswith(": "):
            raise PageError("%s:%d: a definition without a term line" % (where, i + 2))
        # A paragraph: up to the next blank line or block.
        if para_open:
            out.append(".PP")
        j = i
        para = []
        while j < n and body[j].strip() and not body[j].strip().startswith(("```", "# ", "## ", "- ")):
            if j + 1 < n and body[j + 1].startswith(": ") and para:
                break
            para.append(body[j])
            j += 1
        out.extend(text_lines(para))
        para_open = True
        i = j
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description="rankmem man page source to roff")
    ap.add_argument("--version", default="", help="package version for the page footer")
    ap.add_argument("--options", help="src/options.c, for @OPTIONS@")
    ap.add_argument("--output", "-o", help="write here (default: stdout)")
    ap.add_argument("page")
    a = ap.parse_args()
    with open(a.page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    # Reproducible: SOURCE_DATE_EPOCH when set, else the source's mtime.
    stamp = os.environ.get("SOURCE_DATE_EPOCH")
    when = int(stamp) if stamp and stamp.isdigit() else int(os.stat(a.page).st_mtime)
    date = datetime.datetime.fromtimestamp(when, datetime.timezone.utc).strftime("%Y-%m-%d")
    try:
        roff = convert(lines, a.version, date, a.options, a.page)
    except PageError as e:
        sys.stderr.write("md2roff: %s\n" % e)
        return 1
    if a.output:
        tmp = a.output + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(roff)
        os.replace(tmp, a.output)
    else:
        sys.stdout.write(roff)
    return 0


if __name__ == "__main__":
    sys.exit(main())
