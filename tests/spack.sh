#!/bin/sh
# contrib/spack/package.py without Spack: parsed with Python's ast (class,
# variants and their descriptions, depends_on and their conditions), then its
# configure_args() run against a stand-in for Spack's API for every
# combination of variants; every option it can emit must be one configure
# accepts (`configure --help`), except the ones listed as pending. TAP.
: "${srcdir:=.}"
command -v python3 >/dev/null 2>&1 || { echo "1..0 # SKIP no python3"; exit 0; }
[ -x "$srcdir/configure" ] || { echo "1..0 # SKIP no $srcdir/configure"; exit 0; }
"$srcdir/configure" --help >"${TMPDIR:-/tmp}/rankmem-configure-help.$$" 2>&1 || {
    echo "1..1"; echo "not ok 1 - configure --help"; exit 0; }
python3 - "$srcdir/contrib/spack/package.py" "${TMPDIR:-/tmp}/rankmem-configure-help.$$" <<'PY'
import ast
import itertools
import re
import sys
import types

recipe, helpfile = sys.argv[1], sys.argv[2]
# Options the recipe maps ahead of the code that will accept them.
PENDING = {}
EXPECTED_VARIANTS = {"cuda", "mpi", "openmp", "hip", "fortran"}

n = 0
def result(good, what):
    global n
    n += 1
    print("%s %d - %s" % ("ok" if good else "not ok", n, what))
    return good

src = open(recipe).read()
help_text = open(helpfile).read()
tree = ast.parse(src, recipe)

# ---- structure, from the syntax tree ----
classes = [c for c in tree.body if isinstance(c, ast.ClassDef)]
cls = classes[0] if classes else None
bases = [b.id for b in cls.bases if isinstance(b, ast.Name)] if cls else []
result(cls is not None and "AutotoolsPackage" in bases,
       "package.py defines one class deriving from AutotoolsPackage (%s%s)"
       % (cls.name if cls else "none", bases))

def calls(name):
    return [s.value for s in (cls.body if cls else [])
            if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
            and isinstance(s.value.func, ast.Name) and s.value.func.id == name]

def const(node):
    return node.value if isinstance(node, ast.Constant) else None

variants = {}
for c in calls("variant"):
    kw = {k.arg: const(k.value) for k in c.keywords}
    variants[const(c.args[0])] = kw
inherited = {"cuda", "cuda_arch"} if "CudaPackage" in bases else set()
known = set(variants) | inherited
missing = EXPECTED_VARIANTS - known
result(not missing, "variants %s are there (%s%s)" % (
    ", ".join(sorted(EXPECTED_VARIANTS)), ", ".join(sorted(variants)),
    "; cuda, cuda_arch from CudaPackage" if inherited else "") + (
    "; missing: %s" % ", ".join(sorted(missing)) if missing else ""))
nodesc = [v for v, kw in variants.items() if not (kw.get("description") or "").strip()]
result(not nodesc, "every variant has a description" + (": not %s" % nodesc if nodesc else ""))
nodef = [v for v, kw in variants.items() if "default" not in kw]
result(not nodef, "every variant has a default" + (": not %s" % nodef if nodef else ""))

deps = []
for c in calls("depends_on"):
    kw = {k.arg: const(k.value) for k in c.keywords}
    deps.append((const(c.args[0]), kw.get("when")))
def when_variants(when):
    return set(re.findall(r"[+~]([A-Za-z_][\w-]*)", when or "")) | set(
        re.findall(r"\b([A-Za-z_]\w*)=", when or ""))
bad = [(d, w) for d, w in deps if not when_variants(w) <= known]
result(not bad, "every depends_on condition names a variant of the recipe" + (": %s" % bad if bad else ""))
for v, pkg in (("mpi", "mpi"), ("hip", "hip")):
    result(any(d.split("@")[0] == pkg and "+" + v in (w or "") for d, w in deps),
           "+%s depends on %s" % (v, pkg))
result("CudaPackage" in bases or any(d.startswith("cuda") and "+cuda" in (w or "") for d, w in deps),
       "+cuda depends on cuda (directly or through CudaPackage)")
build_only = [d for d, w in deps if d.split("@")[0] in ("autoconf", "automake", "libtool")]
result(len(build_only) == 3, "autotools are build dependencies of the git version")

# ---- configure_args(), run against a stand-in for Spack ----
record = {"variant": [], "depends_on": [], "conflicts": []}
def directive(kind):
    def f(*a, **k):
        record.setdefault(kind, []).append((a, k))
    return f

class Spec:
    def __init__(self, on, archs):
        self.on, self.archs = on, archs
        self.variants = {"cuda_arch": types.SimpleNamespace(value=archs)}
    def satisfies(self, s):
        for sign, v in re.findall(r"([+~])([A-Za-z_][\w-]*)", s):
            if (v in self.on) != (sign == "+"):
                return False
        return True
    def __getitem__(self, name):
        return types.SimpleNamespace(prefix="/opt/" + name, mpicc="/opt/mpi/bin/mpicc",
                                     mpifc="/opt/mpi/bin/mpif90")

class Base:
    def enable_or_disable(self, v):
        return ["--enable-" + v if v in self.spec.on else "--disable-" + v]
    def with_or_without(self, v):
        return ["--with-" + v if v in self.spec.on else "--without-" + v]

api = types.ModuleType("spack.package")
api.AutotoolsPackage = type("AutotoolsPackage", (Base,), {})
api.CudaPackage = type("CudaPackage", (), {})
api.Executable = lambda *a, **k: (lambda *a, **k: None)
for d in ("variant", "depends_on", "conflicts", "version", "maintainers", "license",
          "provides", "patch", "resource", "requires"):
    setattr(api, d, directive(d))
api.__all__ = [k for k in vars(api) if not k.startswith("_")]
sys.modules["spack"] = types.ModuleType("spack")
sys.modules["spack.package"] = api
ns = {}
try:
    exec(compile(src, recipe, "exec"), ns)
    pkg_cls = ns[cls.name]
    ran = True
except Exception as e:  # a recipe that does not even load
    ran = False
    result(False, "the recipe loads with a stand-in for spack.package: %s" % e)

if ran:
    flags = {}
    per_variant = {v: [set(), set()] for v in EXPECTED_VARIANTS}
    combos = 0
    for bits in itertools.product((0, 1), repeat=len(EXPECTED_VARIANTS)):
        on = {v for v, b in zip(sorted(EXPECTED_VARIANTS), bits) if b}
        for archs in (("none",), ("90",), ("80", "90")):
            pkg = pkg_cls.__new__(pkg_cls)
            pkg.spec = Spec(on, archs)
            args = pkg.configure_args()
            combos += 1
            for a in args:
                flags.setdefault(a.split("=", 1)[0] if a.startswith("--") else a.split("=", 1)[0] + "=", a)
            for v in EXPECTED_VARIANTS:
                per_variant[v][v in on] |= set(args)
    result(True, "configure_args() ran for %d combinations of variants" % combos)

    opts = set(re.findall(r"^\s+(--[a-z][a-z0-9-]*)", help_text, re.M))
    envs = set(re.findall(r"^  ([A-Z][A-Z0-9_]*)\s", help_text[help_text.find("influential environment"):], re.M))
    def accepted(flag):
        if flag.endswith("="):
            return flag[:-1] in envs
        m = re.match(r"--(enable|disable|with|without)-(.+)$", flag)
        if not m:
            return flag in opts
        kind, feat = m.groups()
        pair = ("--enable-", "--disable-") if kind in ("enable", "disable") else ("--with-", "--without-")
        return any(p + feat in opts for p in pair)
    for flag in sorted(flags):
        if accepted(flag):
            note = " (was pending: remove it from PENDING in tests/spack.sh)" if flag in PENDING else ""
            result(True, "configure accepts %s%s" % (flags[flag], note))
        elif flag in PENDING:
            print("ok %d - configure does not take %s yet # SKIP pending: %s" % (n + 1, flag, PENDING[flag]))
            n += 1
        else:
            result(False, "configure accepts %s (not in configure --help)" % flags[flag])
    for v in sorted(EXPECTED_VARIANTS):
        off, on = per_variant[v]
        result(off != on, "variant %s changes the configure options" % v)
print("1..%d" % n)
PY
rc=$?
rm -f "${TMPDIR:-/tmp}/rankmem-configure-help.$$"
exit $rc
