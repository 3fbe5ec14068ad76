#!/usr/bin/env python3
"""Checks a rankmem JSON report against what a program is known to have done.

Prints one TAP line per check ("ok - ..." / "not ok - ...", unnumbered: the
calling script counts them), so that each expectation passes or fails on its
own. Exit status 0 whatever the results (the TAP lines carry them); 2 on a
bad command line.

  check.py REPORT --np N [--label L] CHECK...

Checks (each may be repeated):
  --rank PATH OP VALUE    on every rank's record ("ranks"[i]); PATH is dotted
                          (observed.device.peak). OP: == != >= <= > < ~ contains
                          ~ takes VALUE:TOL (|got - VALUE| <= TOL);
                          contains takes a|b|c (any of the substrings)
  --job PATH OP VALUE     on the report's top level (job.ranks, ...)
  --leak SITE RANKS BYTES a "leaks" entry whose site contains SITE (a|b: any)
                          has ranks == RANKS and bytes == BYTES
  --expect-out FILE       lines "EXPECT RANK|all PATH OP VALUE" that a program
                          printed (values it computed itself: PyTorch's
                          reserved bytes, a stencil's field sizes)
  --same OTHER PATH       PATH has the same value on every rank here as in the
                          report OTHER (a run of the same program, another way)
  --timeline              every rank's timeline ("timeline"."bytes"[rank]) peaks
                          at its observed.gpu.peak
  --phase NAME PEAK       the phase NAME ("phases") has peak_min == peak_max == PEAK
"""
import json
import sys

MiB = 1 << 20


def tap(ok, text):
    print(("ok - " if ok else "not ok - ") + text)
    return ok


def get(obj, path):
    """The value at a dotted path, or KeyError."""
    cur = obj
    for part in path.split("."):
        if isinstance(cur, list):
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise KeyError(path)
    return cur


def number(text):
    try:
        return int(text)
    except ValueError:
        return float(text)


def human(v):
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= MiB:
        return "%d (%.3f MiB)" % (v, v / MiB)
    return json.dumps(v)


def compare(got, op, want):
    """(passed, what was wanted, in words)."""
    if op == "contains":
        alts = want.split("|")
        text = got if isinstance(got, str) else json.dumps(got)
        return any(a in text for a in alts), "contains " + " or ".join(repr(a) for a in alts)
    if op in ("==", "!=") and not isinstance(got, (int, float)) or isinstance(got, bool):
        # strings and booleans compare as their JSON text ("on", true)
        text = got if isinstance(got, str) else json.dumps(got)
        return (text == want) == (op == "=="), "%s %s" % (op, want)
    if not isinstance(got, (int, float)):
        return False, "%s %s (got a %s)" % (op, want, type(got).__name__)
    if op == "~":
        value, _, tol = want.partition(":")
        value, tol = number(value), number(tol or "0")
        return abs(got - value) <= tol, "~ %s (within %s)" % (human(value), human(tol))
    w = number(want)
    passed = {"==": got == w, "!=": got != w, ">=": got >= w, "<=": got <= w,
              ">": got > w, "<": got < w}.get(op)
    if passed is None:
        usage_error("unknown operator %r" % op)
    return passed, "%s %s" % (op, human(w))


def describe(op, want):
    if op == "contains":
        return "contains " + " or ".join(repr(a) for a in want.split("|"))
    if op == "~":
        value, _, tol = want.partition(":")
        return "~ %s (within %s)" % (human(number(value)), human(number(tol or "0")))
    try:
        return "%s %s" % (op, human(number(want)))
    except ValueError:
        return "%s %s" % (op, want)


def check_ranks(label, ranks, which, path, op, want):
    """One TAP line for PATH OP VALUE on the ranks listed in which."""
    bad = []
    for r in which:
        try:
            got = get(ranks[r], path)
        except (KeyError, IndexError, ValueError):
            bad.append("rank %d: no %s" % (r, path))
            continue
        passed, _ = compare(got, op, want)
        if not passed:
            bad.append("rank %d: %s" % (r, human(got)))
    where = "every rank (%d)" % len(which) if len(which) != 1 else "rank %d" % which[0]
    text = "%s: %s %s on %s" % (label, path, describe(op, want), where)
    if bad:
        text += " -- " + "; ".join(bad[:4]) + (" ..." if len(bad) > 4 else "")
    return tap(not bad, text)


def usage_error(text):
    sys.stderr.write("check.py: %s (see --help)\n" % text)
    raise SystemExit(2)


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2 if len(argv) < 2 else 0
    report_path = argv[1]
    args = argv[2:]
    np_ = None
    label = report_path
    checks = []
    i = 0
    arity = {"--rank": 3, "--job": 3, "--leak": 3, "--expect-out": 1, "--same": 2,
             "--np": 1, "--label": 1, "--timeline": 0, "--phase": 2}
    while i < len(args):
        a = args[i]
        n = arity.get(a)
        if n is None:
            usage_error("bad argument %r" % a)
        vals = args[i + 1:i + 1 + n]
        if len(vals) != n:
            usage_error("%s takes %d value(s)" % (a, n))
        if a == "--np":
            np_ = int(vals[0])
        elif a == "--label":
            label = vals[0]
        else:
            checks.append((a, vals))
        i += 1 + n

    try:
        with open(report_path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        tap(False, "%s: the report %s reads as JSON (%s)" % (label, report_path, e))
        return 0
    ranks = report.get("ranks")
    if not isinstance(ranks, list):
        tap(False, "%s: the report has a \"ranks\" list" % label)
        return 0
    ranks = sorted(ranks, key=lambda r: r.get("rank", 0))
    if np_ is not None:
        if not tap(len(ranks) == np_, "%s: the report has %d rank records (%d)" %
                   (label, np_, len(ranks))):
            return 0
    every = list(range(len(ranks)))

    for kind, vals in checks:
        if kind == "--rank":
            check_ranks(label, ranks, every, *vals)
        elif kind == "--job":
            path, op, want = vals
            try:
                got = get(report, path)
            except (KeyError, IndexError, ValueError):
                tap(False, "%s: the report has %s" % (label, path))
                continue
            passed, wanted = compare(got, op, want)
            tap(passed, "%s: %s %s (got %s)" % (label, path, wanted, human(got)))
        elif kind == "--leak":
            site, want_ranks, want_bytes = vals
            alts = site.split("|")
            leaks = report.get("leaks")
            if not isinstance(leaks, list):
                tap(False, "%s: the report has a \"leaks\" list (a leak at %s)" % (label, site))
                continue
            hits = [l for l in leaks if any(a in str(l.get("site", "")) for a in alts)]
            good = [l for l in hits if l.get("ranks") == int(want_ranks) and
                    l.get("bytes") == int(want_bytes)]
            text = "%s: a leak at %s on %s ranks, %s bytes in all" % (
                label, " or ".join(alts), want_ranks, want_bytes)
            if not good:
                shown = hits or leaks
                text += " -- %s: %s" % ("at that site" if hits else "the leaks are",
                                        json.dumps(shown[:4]))
            tap(bool(good), text)
        elif kind == "--expect-out":
            try:
                lines = open(vals[0]).read().splitlines()
            except OSError as e:
                tap(False, "%s: the program's expectations in %s (%s)" % (label, vals[0], e))
                continue
            found = 0
            for line in lines:
                w = line.split()
                if len(w) != 5 or w[0] != "EXPECT":
                    continue
                found += 1
                who = every if w[1] == "all" else [int(w[1])]
                if any(r >= len(ranks) for r in who):
                    tap(False, "%s: %s: no rank %s in the report" % (label, line, w[1]))
                    continue
                check_ranks(label, ranks, who, w[2], w[3], w[4])
            if not found:
                tap(False, "%s: the program printed its expectations (EXPECT lines in %s)" %
                    (label, vals[0]))
        elif kind == "--timeline":
            tl = report.get("timeline")
            rows = tl.get("bytes") if isinstance(tl, dict) else None
            if not isinstance(rows, list) or len(rows) != len(ranks):
                tap(False, "%s: the report has a timeline with a row per rank" % label)
                continue
            bad = []
            for r in every:
                try:
                    want = get(ranks[r], "observed.gpu.peak")
                except KeyError:
                    bad.append("rank %d: no observed.gpu.peak" % r)
                    continue
                got = max(rows[r]) if rows[r] else 0
                if got != want:
                    bad.append("rank %d: %s, peak %s" % (r, human(got), human(want)))
            tap(not bad, "%s: each rank's timeline peaks at its observed.gpu.peak%s" % (
                label, " -- " + "; ".join(bad[:4]) if bad else ""))
        elif kind == "--phase":
            name, want = vals[0], int(vals[1])
            phases = report.get("phases")
            hit = [p for p in phases if p.get("name") == name] if isinstance(phases, list) else []
            good = hit and hit[0].get("peak_min") == want and hit[0].get("peak_max") == want
            tap(bool(good), "%s: phase %r peaks at %s on every rank%s" % (
                label, name, human(want), "" if good else " -- phases: %s" % json.dumps(
                    [(p.get("name"), p.get("peak_min"), p.get("peak_max")) for p in phases or []][:8])))
        elif kind == "--same":
            other_path, path = vals
            try:
                with open(other_path) as f:
                    other = sorted(json.load(f)["ranks"], key=lambda r: r.get("rank", 0))
            except (OSError, ValueError, KeyError) as e:
                tap(False, "%s: the other report %s reads (%s)" % (label, other_path, e))
                continue
            bad = []
            for r in every:
                try:
                    a, b = get(ranks[r], path), get(other[r], path)
                except (KeyError, IndexError, ValueError):
                    bad.append("rank %d: missing" % r)
                    continue
                if a != b:
                    bad.append("rank %d: %s here, %s there" % (r, human(a), human(b)))
            tap(not bad, "%s: %s the same as in %s on every rank%s" % (
                label, path, other_path.rsplit("/", 1)[-1],
                " -- " + "; ".join(bad[:4]) if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
