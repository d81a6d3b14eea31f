"""execd's python driver: the interpreter behind one python code context.

execd runs this file as `python3 python.py` with any python from 3.8 on: fd 0
is /dev/null, fds 1 and 2 are the pipes execd streams as stdout and stderr
(the driver makes both line-buffered, so that print("x") is one chunk, as from
a Jupyter kernel), fd 3 carries requests (one JSON object per line), fd 4
carries replies (likewise), and fd 5, the javascript driver's interrupt pipe,
is not used (execd interrupts python with SIGINT). The messages are those of
execd's driver protocol: ready once, then for every execute request a started
(sent once the run can be interrupted, before the code runs), zero or more
display messages, at most one result, at most one error, and always a done
last.

The code runs as in a Jupyter kernel:
- Every cell runs inside the context's asyncio event loop, so top-level await
  works and asyncio.create_task() works without await. The loop runs only while
  a cell runs: tasks a cell leaves behind advance only when a later cell gives
  the loop a turn (awaits), never between cells. Unlike in Jupyter,
  asyncio.run() works in a cell, as in a script: its coroutine runs to the end
  on a loop of its own in a helper thread while the cell waits.
  loop.run_until_complete() on the context's loop cannot be used (it runs).
- IPython syntax at the start of a line: `!cmd` runs cmd in a shell, `%pip`
  runs pip, `%cd`, `%env`, `%pwd` do what they do in IPython, `%matplotlib`
  (and `%config InlineBackend...`, `%load_ext autoreload`, `%autoreload`) are
  accepted and do nothing; a cell starting with `%%bash`, `%%sh` or
  `%%writefile` is run as such; any other magic is a UsageError. A trailing
  `;` after the last expression hides its value.
- `from IPython.display import display, HTML, Image, ...` works: when IPython
  is installed its display functions are redirected to the driver; when it is
  not, a small stand-in module takes its place.
- exit(), quit() and sys.exit() end the run with SystemExit; the context
  stays. input() raises EOFError: the code has no stdin.

Everything lives inside _main, so the user's namespace (a fresh __main__
module) holds nothing of the driver, and the driver's frames, told from the
user's by their file name, never show in a traceback.
"""

import os
import sys


def _main():
    DRIVER_FILE = sys._getframe().f_code.co_filename
    # `python3 python.py` puts the driver's own directory first on sys.path:
    # take it away before anything else is imported, so that nothing there
    # (`import python` least of all) is importable.
    if sys.path and sys.path[0]:
        try:
            if os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(DRIVER_FILE)):
                del sys.path[0]
        except (OSError, ValueError):
            pass

    import ast
    import builtins
    import io
    import json
    import linecache
    import signal
    import _thread
    from binascii import b2a_base64

    REQUESTS, REPLIES, INTERRUPTS = 3, 4, 5
    # Processes the code starts must not inherit the protocol's pipes.
    for fd in (REQUESTS, REPLIES):
        os.set_inheritable(fd, False)
    try:
        os.close(INTERRUPTS)
    except OSError:
        pass

    CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, without importing inspect
    COMPILE_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    KEEP_SOURCES = 500  # cells whose source stays in linecache for tracebacks
    MAIN_THREAD = _thread.get_ident()
    # Size limits keeping every reply line under execd's 16 MiB.
    PLAIN_MAX = 1 << 20  # characters of a text/plain value or an evalue
    TRACEBACK_MAX = 2 << 20  # characters of a traceback, all lines together
    VALUE_MAX = 12 << 20  # bytes of any other MIME value, JSON-encoded
    LINE_MAX = 15 << 20  # bytes of a reply line
    dumps, loads = json.dumps, json.loads

    class S:
        """The driver's state (a class used as a namespace)."""

        run_id = None  # id of the run in progress, None between runs
        count = 0  # execution_count of the last run
        busy = False  # SIGINT raises KeyboardInterrupt only while set
        critical = 0  # > 0 while the main thread writes a reply
        pending = False  # a SIGINT arrived during such a write
        shown = {}  # id(figure) -> figure displayed during this run
        loop = None  # the context's asyncio loop, made at the first run
        snapshot = None  # the contextvars a cell's task ended with
        pyplot = False  # matplotlib.pyplot has been imported and patched
        sources = []  # linecache names of the cells kept
        shim = None  # the names of the IPython stand-in, once built
        streams = []  # standard streams replaced at start, kept open

    S.driver_module = sys.modules["__main__"]
    write_lock = _thread.allocate_lock()

    def name_as(module):
        """Gives a class or function defined here the module and qualified
        name users see (not "_main.<locals>...")."""

        def rename(obj):
            obj.__module__ = module
            obj.__qualname__ = obj.__name__
            return obj

        return rename

    # ---- standard streams --------------------------------------------------

    def line_buffered(name, fd):
        """Makes sys.<name> line-buffered: one write per line, as a terminal
        gets, also when python was started unbuffered (-u or
        PYTHONUNBUFFERED), which writes every print() in two pieces."""
        f = getattr(sys, name)
        stderr = name == "stderr"
        try:
            if isinstance(f.buffer, io.BufferedWriter):
                f.reconfigure(line_buffering=True, write_through=stderr)
                return
            new = io.TextIOWrapper(
                io.BufferedWriter(io.FileIO(fd, "wb", closefd=False)),
                encoding=f.encoding,
                errors=f.errors,
                newline="\n",
                line_buffering=True,
                write_through=stderr,
            )
        except Exception:
            return  # no such stream, or not a file: leave it as it is
        try:
            new.buffer.raw.name = "<%s>" % name
        except Exception:
            pass
        f.flush()
        S.streams.append(f)
        setattr(sys, name, new)
        setattr(sys, "__%s__" % name, new)

    line_buffered("stdout", 1)
    line_buffered("stderr", 2)

    # ---- replies ---------------------------------------------------------

    def truncate(text, limit=PLAIN_MAX):
        if len(text) <= limit:
            return text
        return text[:limit] + "\n... [truncated: %d more characters]" % (len(text) - limit)

    def encode(msg):
        try:
            line = dumps(msg, allow_nan=False, separators=(",", ":"))
            if len(line) <= LINE_MAX:
                return line
            problem = "it is %.1f MiB, over the limit of %d MiB" % (len(line) / (1 << 20), LINE_MAX >> 20)
        except (TypeError, ValueError, RecursionError) as e:
            # Formatting checks every value, so this is a driver bug; still,
            # the run must get its message.
            problem = safe_str(e)
        note = "execd: cannot send the %s message: %s" % (msg.get("type"), problem)
        if "data" in msg:
            msg = dict(msg, data={"text/plain": note})
        elif msg.get("type") == "error":
            msg = dict(msg, ename=truncate(safe_str(msg.get("ename")), 200), evalue=note, traceback=[])
        else:
            msg = {k: v for k, v in msg.items() if k in ("type", "id", "execution_count")}
        return dumps(msg, separators=(",", ":"))

    def write_reply(msg):
        data = (encode(msg) + "\n").encode()
        main = _thread.get_ident() == MAIN_THREAD
        if main:
            S.critical += 1
        try:
            with write_lock:
                view = memoryview(data)
                while view:
                    view = view[os.write(REPLIES, view) :]
        finally:
            if main:
                S.critical -= 1
        if main and S.pending and S.busy and not S.critical:
            # An interrupt that arrived while the line was being written.
            S.pending = False
            raise KeyboardInterrupt

    def on_sigint(signum, frame):
        # While idle the driver ignores SIGINT; during a run it interrupts the
        # code, but never in the middle of writing a reply line.
        if not S.busy:
            return
        if S.critical:
            S.pending = True
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)

    # ---- rich formatting ---------------------------------------------------

    RICH = (
        ("text/html", "_repr_html_"),
        ("text/markdown", "_repr_markdown_"),
        ("text/latex", "_repr_latex_"),
        ("image/svg+xml", "_repr_svg_"),
        ("image/png", "_repr_png_"),
        ("image/jpeg", "_repr_jpeg_"),
        ("application/json", "_repr_json_"),
    )
    BINARY = ("image/png", "image/jpeg")

    def method(obj, name):
        try:
            m = getattr(obj, name, None)
        except Exception:
            return None
        return m if callable(m) else None

    def normalize(mime, value):
        """Returns value as the protocol sends it for mime, or None to skip it."""
        if isinstance(value, tuple) and len(value) == 2:
            value = value[0]  # (data, metadata)
        if mime in BINARY:
            if isinstance(value, (bytes, bytearray, memoryview)):
                return b2a_base64(bytes(value), newline=False).decode("ascii")
            if isinstance(value, str):
                return value.replace("\n", "")
            return None
        if mime == "application/json" or mime.endswith("+json"):
            try:
                dumps(value, allow_nan=False)
            except Exception:
                return None
            return value
        if isinstance(value, (bytes, bytearray)):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return None
        return value if isinstance(value, str) else None

    def safe_repr(obj):
        try:
            return repr(obj)
        except Exception as e:
            return "<%s object; repr() failed: %s>" % (type(obj).__name__, safe_str(e))

    def safe_str(obj):
        try:
            return str(obj)
        except Exception:
            return "<%s object; str() failed>" % type(obj).__name__

    def is_figure(obj):
        mod = sys.modules.get("matplotlib.figure")
        cls = getattr(mod, "Figure", None) if mod is not None else None
        try:
            return cls is not None and isinstance(obj, cls)
        except Exception:
            return False

    def figure_png(fig):
        buf = io.BytesIO()
        try:
            fig.savefig(buf, format="png", bbox_inches="tight")
        except Exception:
            return None
        return b2a_base64(buf.getvalue(), newline=False).decode("ascii")

    def cap(data):
        """Returns data with text/plain truncated and the values too big for
        a reply line dropped, each drop noted in text/plain."""
        plain = data.pop("text/plain", None)
        notes = []
        sizes = {}
        for mime in list(data):
            try:
                n = len(dumps(data[mime], allow_nan=False))
            except Exception:
                n = LINE_MAX
            if n > VALUE_MAX:
                del data[mime]
                notes.append("[%s output dropped: %.1f MiB is over the limit of %d MiB]" % (mime, n / (1 << 20), VALUE_MAX >> 20))
            else:
                sizes[mime] = n
        budget = LINE_MAX - (64 << 10) - (len(dumps(plain)) if plain is not None else 0)
        while sizes and sum(sizes.values()) > budget:
            mime = max(sizes, key=sizes.get)
            notes.append("[%s output dropped: %.1f MiB does not fit in one reply]" % (mime, sizes.pop(mime) / (1 << 20)))
            del data[mime]
        out = {}
        parts = ([truncate(plain)] if plain is not None else []) + notes
        if parts:
            out["text/plain"] = "\n".join(parts)
        out.update(data)
        return out

    def fmt(obj):
        """Returns the MIME bundle of obj: text/plain always, rich types when
        the object offers them. A formatter that raises is skipped."""
        rich = {}
        if is_figure(obj):
            png = figure_png(obj)
            if png is not None:
                rich["image/png"] = png
        elif not isinstance(obj, type):
            m = method(obj, "_repr_mimebundle_")
            if m is not None:
                try:
                    bundle = m(include=None, exclude=None)
                except Exception:
                    bundle = None
                if isinstance(bundle, tuple) and len(bundle) == 2:
                    bundle = bundle[0]
                if isinstance(bundle, dict):
                    for mime, value in bundle.items():
                        if isinstance(mime, str):
                            value = normalize(mime, value)
                            if value is not None:
                                rich[mime] = value
            for mime, name in RICH:
                if mime in rich:
                    continue
                m = method(obj, name)
                if m is None:
                    continue
                try:
                    value = m()
                except Exception:
                    continue
                if value is not None:
                    value = normalize(mime, value)
                    if value is not None:
                        rich[mime] = value
        plain = rich.pop("text/plain", None)
        data = {"text/plain": plain if isinstance(plain, str) else safe_repr(obj)}
        data.update(rich)
        return cap(data)

    def raw_bundle(obj):
        """Returns the bundle of display(obj, raw=True): obj is a dict of
        MIME type to value."""
        if not isinstance(obj, dict):
            return fmt(obj)
        data = {}
        for mime, value in obj.items():
            if isinstance(mime, str):
                value = normalize(mime, value)
                if value is not None:
                    data[mime] = value
        return cap(data)

    @name_as("IPython.core.display_functions")
    class DisplayHandle:
        """What display(obj, display_id=...) returns. Outputs cannot be
        changed once sent, so update() shows the object again."""

        def __init__(self, display_id=None):
            self.display_id = display_id

        def __repr__(self):
            return "<DisplayHandle display_id=%s>" % self.display_id

        def display(self, obj, **kwargs):
            display(obj)

        def update(self, obj, **kwargs):
            display(obj)

    def display(*objs, include=None, exclude=None, metadata=None, transient=None, display_id=None, raw=False, clear=False, **kwargs):
        """Shows each object as rich output of the run in progress, as
        Jupyter's display() does."""
        for obj in objs:
            rid = S.run_id
            if rid is None:
                break  # between runs there is no one to show it to
            data = raw_bundle(obj) if raw else fmt(obj)
            if include is not None:
                data = {k: v for k, v in data.items() if k in include}
            if exclude is not None:
                data = {k: v for k, v in data.items() if k not in exclude}
            if is_figure(obj):
                S.shown[id(obj)] = obj
            if data:
                write_reply({"type": "display", "id": rid, "data": data})
        if display_id:
            return DisplayHandle(display_id)
        return None

    def update_display(obj, display_id=None, **kwargs):
        """Shows obj again: outputs cannot be changed once sent."""
        display(obj)

    def clear_output(wait=False):
        """Does nothing: outputs cannot be taken back once sent."""

    # ---- matplotlib --------------------------------------------------------

    def open_figures(plt):
        return [plt.figure(num) for num in plt.get_fignums()]

    def patch_pyplot(plt):
        def show(*args, **kwargs):
            """Displays every open figure in the run's output and closes it
            (execd's replacement for pyplot.show)."""
            for fig in open_figures(plt):
                display(fig)
            plt.close("all")

        show.__wrapped__ = getattr(plt, "show", None)
        plt.show = show
        S.pyplot = True

    def patch_ipython(module):
        # Outside a kernel IPython's display() prints the object's repr and
        # clear_output() prints terminal escapes: the driver's do what a
        # notebook would. vars(), not hasattr: IPython.core.display warns
        # about deprecated names looked up through its __getattr__.
        names = vars(module)
        for name, fn in (("display", display), ("update_display", update_display), ("clear_output", clear_output)):
            if name in names:
                setattr(module, name, fn)

    PATCHES = {
        "matplotlib.pyplot": patch_pyplot,
        "IPython.core.display_functions": patch_ipython,
        "IPython.core.display": patch_ipython,
    }

    class PatchingLoader:
        """Runs a module's own loader, then patches the module."""

        def __init__(self, loader, patch):
            self._loader = loader
            self._patch = patch

        def __getattr__(self, name):
            return getattr(self._loader, name)

        def create_module(self, spec):
            return self._loader.create_module(spec)

        def exec_module(self, module):
            self._loader.exec_module(module)
            self._patch(module)

    class ShimLoader:
        """Makes the IPython stand-in package."""

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            fill_ipython_shim(module)

    class Finder:
        """execd's import hook: it sees matplotlib.pyplot and IPython get
        imported, so that the driver itself imports neither, patches them,
        and stands in for IPython when it is not installed."""

        def find_spec(self, name, path=None, target=None):
            patch = PATCHES.get(name)
            if patch is None and name != "IPython":
                return None
            for finder in sys.meta_path:
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                if name != "IPython":
                    return None
                from importlib.machinery import ModuleSpec

                return ModuleSpec("IPython", ShimLoader(), is_package=True)
            if patch is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = PatchingLoader(spec.loader, patch)
            return spec

    def flush_figures(result):
        """Displays and closes the figures still open at the end of a run,
        except the run's result and those it displayed already."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None or not S.pyplot:
            return
        try:
            figs = open_figures(plt)
        except Exception:
            return
        if not figs:
            return
        for fig in figs:
            if fig is result or S.shown.get(id(fig)) is fig:
                continue
            display(fig)
        try:
            plt.close("all")
        except Exception:
            pass

    # ---- the IPython stand-in ----------------------------------------------

    def shim_names():
        """Returns the names of the IPython.display stand-in, made once."""
        if S.shim is not None:
            return S.shim
        module = "IPython.core.display"

        def exists(path):
            try:
                return os.path.isfile(path)
            except Exception:
                return False

        def fetch(url):
            from urllib.request import urlopen

            with urlopen(url, timeout=60) as r:
                return r.read()

        @name_as(module)
        class DisplayObject:
            """An object shown through its _repr_*_ methods; its data comes
            from data, a file (filename) or a URL (url)."""

            binary = False

            def __init__(self, data=None, url=None, filename=None, metadata=None):
                if isinstance(data, os.PathLike):
                    data, filename = None, os.fspath(data)
                if isinstance(data, str) and url is None and filename is None:
                    if data.startswith(("http://", "https://")):
                        data, url = None, data
                    elif exists(data):
                        data, filename = None, data
                self.data, self.url, self.filename, self.metadata = data, url, filename, metadata
                self.reload()

            def reload(self):
                """Reads the data again from the file or URL it came from."""
                if self.filename is not None:
                    with open(self.filename, "rb") as f:
                        self.data = f.read()
                elif self.url is not None:
                    self.data = fetch(self.url)
                else:
                    return
                if not self.binary:
                    self.data = self.data.decode("utf-8", "replace")

            def __repr__(self):
                return "<%s.%s object>" % (type(self).__module__, type(self).__qualname__)

        @name_as(module)
        class TextDisplayObject(DisplayObject):
            """A DisplayObject whose data is text."""

            def text(self):
                data = self.data
                if isinstance(data, (bytes, bytearray)):
                    return bytes(data).decode("utf-8", "replace")
                return data if data is None or isinstance(data, str) else str(data)

        @name_as(module)
        class HTML(TextDisplayObject):
            """HTML, shown as text/html."""

            def _repr_html_(self):
                return self.text()

        @name_as(module)
        class Markdown(TextDisplayObject):
            """Markdown, shown as text/markdown."""

            def _repr_markdown_(self):
                return self.text()

        @name_as(module)
        class Latex(TextDisplayObject):
            """LaTeX, shown as text/latex."""

            def _repr_latex_(self):
                return self.text()

        @name_as(module)
        class Math(TextDisplayObject):
            """A LaTeX formula, shown as text/latex in display style."""

            def _repr_latex_(self):
                text = self.text()
                return None if text is None else "$\\displaystyle %s$" % text.strip("$")

        @name_as(module)
        class SVG(TextDisplayObject):
            """An SVG image, shown as image/svg+xml."""

            def _repr_svg_(self):
                return self.text()

        @name_as(module)
        class JSON(DisplayObject):
            """A JSON value (or JSON text), shown as application/json."""

            def __init__(self, data=None, url=None, filename=None, expanded=False, metadata=None, root="root", **kwargs):
                if isinstance(data, str) and not data.lstrip().startswith(("{", "[")):
                    super().__init__(data, url, filename, metadata)
                else:
                    super().__init__(None, url, filename, metadata)
                    if data is not None:
                        self.data = data
                if isinstance(self.data, (bytes, bytearray)):
                    self.data = bytes(self.data).decode("utf-8")
                if isinstance(self.data, str):
                    self.data = loads(self.data)

            def _repr_json_(self):
                return self.data

        FORMATS = {"png": "png", "jpeg": "jpeg", "jpg": "jpeg", "gif": "gif", "webp": "webp"}

        def sniff(data):
            if data[:8] == b"\x89PNG\r\n\x1a\n":
                return "png"
            if data[:2] == b"\xff\xd8":
                return "jpeg"
            if data[:4] == b"GIF8":
                return "gif"
            if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
                return "webp"
            return "png"

        @name_as(module)
        class Image(DisplayObject):
            """A PNG or JPEG image (image/png, image/jpeg as base64); other
            formats, and URLs not embedded, are shown as an HTML <img>."""

            binary = True

            def __init__(self, data=None, url=None, filename=None, format=None, embed=None, width=None, height=None, retina=False, unconfined=False, metadata=None, alt=None):
                if isinstance(data, os.PathLike):
                    data, filename = None, os.fspath(data)
                if isinstance(data, str) and url is None and filename is None:
                    if data.startswith(("http://", "https://")):
                        data, url = None, data
                    elif exists(data):
                        data, filename = None, data
                    else:
                        raise ValueError("Image: %r is neither a file nor a URL; pass image bytes as data" % truncate(data, 200))
                source = filename if filename is not None else url
                if format is None and source is not None:
                    ext = os.path.splitext(source.split("?", 1)[0])[1][1:].lower()
                    format = FORMATS.get(ext)
                self.embed = embed if embed is not None else url is None
                self.width, self.height, self.alt = width, height, alt
                self.format = format
                super().__init__(data, url if self.embed else None, filename, metadata)
                self.url = url
                if isinstance(self.data, (bytearray, memoryview)):
                    self.data = bytes(self.data)
                if self.format is None and isinstance(self.data, bytes):
                    self.format = sniff(self.data)
                self.format = FORMATS.get(str(self.format).lower(), str(self.format).lower())

            def _repr_png_(self):
                return self.data if self.embed and self.format == "png" else None

            def _repr_jpeg_(self):
                return self.data if self.embed and self.format == "jpeg" else None

            def _repr_html_(self):
                import html

                if not self.embed:
                    src = self.url
                elif self.format not in ("png", "jpeg") and isinstance(self.data, bytes):
                    src = "data:image/%s;base64,%s" % (self.format, b2a_base64(self.data, newline=False).decode("ascii"))
                else:
                    return None
                attrs = "".join(' %s="%s"' % (k, html.escape(str(v))) for k, v in (("width", self.width), ("height", self.height), ("alt", self.alt)) if v is not None)
                return '<img src="%s"%s/>' % (html.escape(src), attrs)

        @name_as("IPython.lib.display")
        class IFrame:
            """A web page in an HTML <iframe>."""

            def __init__(self, src, width, height, extras=None, **kwargs):
                self.src, self.width, self.height = src, width, height
                self.extras = extras or []
                self.params = kwargs

            def _repr_html_(self):
                import html
                from urllib.parse import urlencode

                src = self.src + ("?" + urlencode(self.params) if self.params else "")
                return '<iframe width="%s" height="%s" src="%s" frameborder="0" allowfullscreen %s></iframe>' % (
                    html.escape(str(self.width)),
                    html.escape(str(self.height)),
                    html.escape(src),
                    " ".join(self.extras),
                )

        def display_as(mime):
            def show(*objs, raw=False, metadata=None, **kwargs):
                if raw:
                    for obj in objs:
                        display({mime: obj}, raw=True)
                else:
                    display(*objs, include=[mime])

            show.__name__ = show.__qualname__ = "display_" + mime.split("/")[1].split("+")[0]
            return show

        names = {
            "display": display,
            "update_display": update_display,
            "clear_output": clear_output,
            "DisplayHandle": DisplayHandle,
            "DisplayObject": DisplayObject,
            "TextDisplayObject": TextDisplayObject,
            "HTML": HTML,
            "Markdown": Markdown,
            "Latex": Latex,
            "Math": Math,
            "SVG": SVG,
            "JSON": JSON,
            "Image": Image,
            "IFrame": IFrame,
        }
        for mime in ("text/html", "text/markdown", "text/latex", "image/svg+xml", "image/png", "image/jpeg", "application/json"):
            fn = display_as(mime)
            names[fn.__name__] = fn
        S.shim = names
        return names

    def get_ipython():
        """Returns None: no IPython shell runs this code."""
        return None

    def fill_ipython_shim(pkg):
        """Makes pkg the IPython stand-in: IPython.display (also
        IPython.core.display) with display(), HTML, Markdown, Image..."""
        names = shim_names()
        new = type(sys)
        disp = new("IPython.display", "execd's stand-in for IPython.display: IPython is not installed.")
        disp.__dict__.update(names)
        disp.__all__ = sorted(names)
        core = new("IPython.core", "execd's stand-in for IPython.core.")
        core.__path__ = []
        core.display = core.display_functions = disp
        pkg.__doc__ = "execd's stand-in for IPython, which is not installed: only IPython.display."
        pkg.display, pkg.core, pkg.get_ipython = disp, core, get_ipython
        sys.modules.update(
            {
                "IPython.display": disp,
                "IPython.core": core,
                "IPython.core.display": disp,
                "IPython.core.display_functions": disp,
            }
        )

    # ---- magics --------------------------------------------------------------

    @name_as("__main__")
    class UsageError(Exception):
        """IPython syntax this context does not support."""

    NO_OP_MAGICS = ("matplotlib", "autoreload")
    LINE_MAGICS = ("pip", "cd", "env", "pwd")
    CELL_MAGICS = ("bash", "sh", "writefile")

    def transform_magics(source):
        """Returns source with the IPython escapes that start a logical line
        (`!cmd`, `%magic args`) replaced, line for line, by Python calling
        the driver; raises UsageError for a magic not supported. Lines inside
        a string, a bracket or a backslash continuation are not touched."""
        if "!" not in source and "%" not in source:
            return source
        out = []
        quote = None  # the quote of a string still open at the end of a line
        depth = 0  # brackets open
        cont = False  # the previous line ended with a backslash
        changed = False
        lines = source.split("\n")
        for k in range(len(lines)):
            line = lines[k] + ("\n" if k < len(lines) - 1 else "")
            if quote is None and depth == 0 and not cont:
                stripped = line.lstrip(" \t\f")
                if stripped[:1] in ("!", "%"):
                    body = stripped.rstrip("\r\n")
                    out.append(line[: len(line) - len(stripped)] + magic_call(body) + stripped[len(body) :])
                    changed = True
                    continue
            cont = False
            i, n = 0, len(line)
            while i < n:
                c = line[i]
                if quote is not None:
                    if c == "\\":
                        i += 2
                    elif line.startswith(quote, i):
                        i += len(quote)
                        quote = None
                    else:
                        i += 1
                    continue
                if c == "#":
                    break
                if c in "\"'":
                    quote = c * 3 if line.startswith(c * 3, i) else c
                    i += len(quote)
                    continue
                if c in "([{":
                    depth += 1
                elif c in ")]}":
                    depth = max(0, depth - 1)
                elif c == "\\" and line[i + 1 :].strip("\r\n") == "":
                    cont = True
                i += 1
            if quote in ("'", '"') and not line.rstrip("\r\n").endswith("\\"):
                quote = None  # an unterminated one-line string: a SyntaxError later
            out.append(line)
        return "".join(out) if changed else source

    def magic_call(body):
        """Returns the Python that runs one escaped line."""
        if body.startswith("!"):
            return "__execd_magic__(%r, %r)" % ("!", body.lstrip("!").strip())
        text = body[1:]
        name = text.split(None, 1)[0] if text.strip() else ""
        args = text[len(name) :].strip()
        if name in NO_OP_MAGICS or (name == "load_ext" and args == "autoreload") or (name == "config" and args.startswith("InlineBackend.")):
            return "pass"
        if name in LINE_MAGICS:
            return "__execd_magic__(%r, %r)" % (name, args)
        raise UsageError("magic %%%s is not supported here" % name)

    def expand(cmd):
        """Substitutes the user's variables in a shell command, as IPython
        does: {expr} when expr names a variable of the namespace, $name when
        name is one; anything else is left as it is."""
        if "{" not in cmd and "$" not in cmd:
            return cmd
        import re

        def brace(m):
            try:
                tree = ast.parse(m.group(1).strip(), mode="eval")
                names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
                if not names & ns.keys() or any(n not in ns and not hasattr(builtins, n) for n in names):
                    return m.group(0)
                return str(eval(compile(tree, "<expansion>", "eval"), ns))
            except Exception:
                return m.group(0)

        def dollar(m):
            name = m.group(1)
            return str(ns[name]) if name in ns else m.group(0)

        cmd = re.sub(r"\{([^{}]+)\}", brace, cmd)
        return re.sub(r"(?<!\$)\$([A-Za-z_][A-Za-z0-9_]*)", dollar, cmd)

    def shell(cmd, argv=None):
        """Runs cmd in /bin/sh (or argv) with the cell's stdout and stderr,
        so its output streams; returns its exit status."""
        import importlib
        import subprocess

        flush_std()
        status = subprocess.run(argv if argv is not None else cmd, shell=argv is None).returncode
        importlib.invalidate_caches()  # it may have installed modules
        return status

    def magic(name, args):
        """Runs one line magic or shell escape for the code (builtins'
        __execd_magic__)."""
        if name == "!":
            if args:
                ns["_exit_code"] = shell(expand(args))
            return None
        if name == "pip":
            import shlex

            shell(shlex.quote(sys.executable or "python3") + " -m pip " + expand(args))
            return None
        if name == "cd":
            target = expand(args).strip()
            if len(target) > 1 and target[0] == target[-1] and target[0] in "\"'":
                target = target[1:-1]
            os.chdir(os.path.expanduser(target or "~"))
            print(os.getcwd())
            return None
        if name == "pwd":
            return os.getcwd()
        if name == "env":
            if not args:
                return dict(os.environ)
            key, sep, value = args.partition("=")
            if not sep:
                key, _, value = args.partition(" ")
                if not value.strip():
                    return os.environ[key.strip()]
            key, value = key.strip(), expand(value.strip())
            os.environ[key] = value
            print("env: %s=%s" % (key, value))
            return None
        raise UsageError("magic %%%s is not supported here" % name)

    def cell_magic(source):
        """Runs a cell whose first line is a %%magic; returns False when it
        is not such a cell."""
        lines = source.split("\n")
        i = 0
        while i < len(lines) and not lines[i].strip():
            i += 1
        if i == len(lines) or not lines[i].lstrip().startswith("%%"):
            return False
        head = lines[i].strip()[2:]
        name = head.split(None, 1)[0] if head.strip() else ""
        args = head[len(name) :].strip()
        body = "\n".join(lines[i + 1 :])
        if name not in CELL_MAGICS:
            raise UsageError("magic %%%%%s is not supported here" % name)
        if name in ("bash", "sh"):
            shell(None, [name, "-c", body])
            return True
        import shlex

        words = shlex.split(expand(args))
        append = False
        while words and words[0] in ("-a", "--append"):
            append = True
            words.pop(0)
        if len(words) != 1:
            raise UsageError("usage: %%writefile [-a] FILENAME")
        path = os.path.expanduser(words[0])
        if os.path.exists(path):
            print(("Appending to %s" if append else "Overwriting %s") % words[0])
        else:
            print("Writing %s" % words[0])
        if body and not body.endswith("\n"):
            body += "\n"
        with open(path, "a" if append else "w", encoding="utf-8") as f:
            f.write(body)
        return True

    # ---- builtins the code gets ----------------------------------------------

    @name_as("_sitebuiltins")
    class Quitter:
        """exit and quit: they raise SystemExit, which ends the run with an
        error and leaves the context as it is (site's close sys.stdin)."""

        def __init__(self, name):
            self.name = name

        def __repr__(self):
            return "Use %s() or %s(status) to end the run with SystemExit; the context stays" % (self.name, self.name)

        def __call__(self, code=None):
            raise SystemExit() if code is None else SystemExit(code)

    stdin0 = sys.stdin
    real_input = builtins.input

    @name_as("builtins")
    def input(prompt=""):
        """Reads a line from sys.stdin; the context's own stdin has none."""
        if sys.stdin is stdin0:
            raise EOFError("input() is not available: code in a context has no stdin")
        return real_input(prompt)

    # ---- execution ---------------------------------------------------------

    main = type(sys)("__main__")
    main.__dict__["__builtins__"] = builtins
    ns = main.__dict__

    def get_loop():
        loop = S.loop
        if loop is None or loop.is_closed():
            import asyncio

            loop = S.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            patch_asyncio_run(asyncio)
            # A cell is one callback of the loop, however long it runs: in
            # asyncio's debug mode (python -X dev) each would be reported as
            # a slow callback.
            loop.slow_callback_duration = 1e9
        return loop

    def patch_asyncio_run(asyncio):
        """Lets script-style code call asyncio.run() in a cell. The cell
        runs inside the context's loop, where the real asyncio.run refuses
        to start; there the coroutine runs to its end on a loop of its own,
        in a helper thread, while the cell waits, as it would in a script.
        An interrupt cancels it."""
        import threading

        real_run = asyncio.run
        if getattr(real_run, "_osb", False):
            return

        def run(main, **kwargs):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return real_run(main, **kwargs)
            box = {}
            loop = asyncio.new_event_loop()

            def target():
                asyncio.set_event_loop(loop)
                try:
                    box["value"] = loop.run_until_complete(main)
                except BaseException as e:
                    box["error"] = e
                finally:
                    try:
                        rest = asyncio.all_tasks(loop)
                        for t in rest:
                            t.cancel()
                        if rest:
                            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
                        loop.run_until_complete(loop.shutdown_asyncgens())
                    finally:
                        asyncio.set_event_loop(None)
                        loop.close()

            t = threading.Thread(target=target, name="asyncio.run", daemon=True)
            t.start()
            try:
                t.join()
            except BaseException:
                # Interrupted: cancel what the coroutine runs, give it a
                # moment to unwind, and let the interrupt through.
                def cancel_all():
                    for task in asyncio.all_tasks(loop):
                        task.cancel()

                try:
                    loop.call_soon_threadsafe(cancel_all)
                except RuntimeError:
                    pass  # already closed
                t.join(2)
                raise
            if "error" in box:
                raise box["error"]
            return box.get("value")

        run._osb = True
        run.__wrapped__ = real_run
        asyncio.run = run

    async def cell(body, last):
        """Runs a cell's code objects in the context's loop: body, then the
        last expression; returns (True, its value) or (False, the exception),
        so that no exception the code raises passes through asyncio."""
        try:
            value = None
            if body is not None:
                value = eval(body, ns)
                if body.co_flags & CO_COROUTINE:
                    await value
                value = None
            if last is not None:
                value = eval(last, ns)
                if last.co_flags & CO_COROUTINE:
                    value = await value
            return True, value
        except BaseException as e:
            return False, e
        finally:
            import contextvars

            S.snapshot = contextvars.copy_context()

    def run_cell(body, last):
        loop = get_loop()
        S.snapshot = None
        task = loop.create_task(cell(body, last))
        try:
            ok, value = loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                # Interrupted while the loop waited: unwind the task so that
                # the next run does not resume it.
                task.cancel()
                try:
                    loop.run_until_complete(task)
                except BaseException:
                    pass
            raise
        finally:
            keep_context_vars()
        if not ok:
            raise value
        return value

    def keep_context_vars():
        # A task runs in a copy of the driver's context: what the cell set
        # (decimal.setcontext, a ContextVar) goes back into it, so that the
        # next cell sees it, as it would in a script.
        snapshot, S.snapshot = S.snapshot, None
        if snapshot is None:
            return
        for var, value in snapshot.items():
            try:
                if var.get() is not value:
                    var.set(value)
            except LookupError:
                var.set(value)

    def remember_source(filename, source):
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        S.sources.append(filename)
        if len(S.sources) > KEEP_SOURCES:
            linecache.cache.pop(S.sources.pop(0), None)

    def hides_result(source, node):
        """Reports whether the text after the statement node, the last of
        the cell, starts with a ';' (as in IPython, it hides the value)."""
        # Lines as the parser counts them; node's column is in UTF-8 bytes.
        lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        if node.end_lineno is None or node.end_lineno > len(lines):
            return False
        rest = lines[node.end_lineno - 1].encode("utf-8", "surrogatepass")[node.end_col_offset :]
        rest = [rest.decode("utf-8", "replace")] + lines[node.end_lineno :]
        text = "".join(line.split("#", 1)[0] for line in rest)
        return text.replace("\\", "").lstrip().startswith(";")

    def execute(source, n):
        """Runs a cell; returns the value of its last expression statement,
        None when it has none or a ';' follows it."""
        filename = "<cell-%d>" % n
        remember_source(filename, source)
        if cell_magic(source):
            return None
        source = transform_magics(source)
        tree = ast.parse(source, filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            node = tree.body.pop()
            if hides_result(source, node):
                tree.body.append(node)
            else:
                last = compile(ast.Expression(node.value), filename, "eval", COMPILE_FLAGS, True)
        body = compile(tree, filename, "exec", COMPILE_FLAGS, True) if tree.body else None
        if body is None and last is None:
            return None
        return run_cell(body, last)

    def strip_driver(te):
        """Drops the driver's frames from te and the exceptions chained to
        it."""
        import traceback

        seen = set()
        todo = [te]
        while todo:
            t = todo.pop()
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            t.stack = traceback.StackSummary.from_list([f for f in t.stack if f.filename != DRIVER_FILE])
            todo.append(t.__cause__)
            todo.append(t.__context__)
            todo.extend(getattr(t, "exceptions", None) or ())

    def format_traceback(e):
        import traceback

        # The frames before the first one of the user's code are the driver's
        # and asyncio's.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_globals is not ns:
            tb = tb.tb_next
        try:
            te = traceback.TracebackException(type(e), e, tb)
            strip_driver(te)
            lines = list(te.format())
        except Exception:
            lines = ["%s: %s\n" % (type(e).__name__, safe_str(e))]
        return cap_lines("".join(lines).splitlines())

    def cap_lines(lines):
        """Returns lines truncated to fit in a reply: each line to
        PLAIN_MAX, all of them to TRACEBACK_MAX, keeping the first line and
        the last ones (where the exception is)."""
        lines = [truncate(line) for line in lines]
        if sum(len(line) for line in lines) <= TRACEBACK_MAX or len(lines) < 2:
            return lines
        kept, size = [], len(lines[0])
        for line in reversed(lines[1:]):
            if size + len(line) > TRACEBACK_MAX:
                break
            kept.append(line)
            size += len(line)
        kept.reverse()
        return [lines[0], "... [truncated: %d more lines]" % (len(lines) - 1 - len(kept))] + kept

    def send_error(rid, e):
        write_reply(
            {
                "type": "error",
                "id": rid,
                "ename": type(e).__name__,
                "evalue": truncate(safe_str(e)),
                "traceback": format_traceback(e),
            }
        )

    def flush_std():
        for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                f.flush()
            except Exception:
                pass

    def run(rid, source):
        S.count += 1
        n = S.count
        S.run_id, S.shown = rid, {}
        errored = False
        result = None
        S.busy = True
        try:
            try:
                write_reply({"type": "started", "id": rid})
                value = execute(source, n)
                if value is not None:
                    result = value
                    write_reply({"type": "result", "id": rid, "execution_count": n, "data": fmt(value)})
            except BaseException as e:
                S.busy = False
                errored = True
                send_error(rid, e)
                S.busy = True
            flush_figures(result)
        except BaseException as e:
            # An interrupt or a failure after the code itself: still at most
            # one error per run.
            S.busy = False
            if not errored:
                try:
                    send_error(rid, e)
                except OSError:
                    raise
                except BaseException:
                    pass
        finally:
            S.busy = False
            S.pending = False
            S.run_id = None
            S.shown = {}
            flush_std()
        write_reply({"type": "done", "id": rid, "execution_count": n})

    builtins.display = display
    builtins.exit = Quitter("exit")
    builtins.quit = Quitter("quit")
    builtins.input = input
    builtins.__execd_magic__ = magic
    sys.meta_path.insert(0, Finder())
    sys.modules["__main__"] = main
    sys.argv = [""]
    # Like an interactive interpreter, the user's code imports modules from
    # the current directory; the driver's own imports above could not.
    sys.path.insert(0, "")

    requests = os.fdopen(REQUESTS, "rb")
    write_reply({"type": "ready", "language": "python", "version": "%d.%d.%d" % sys.version_info[:3]})
    # Every run needs asyncio (some 30 ms to import): when no request is
    # waiting yet, import it now rather than in the first run.
    try:
        import select

        if not select.select([REQUESTS], [], [], 0)[0]:
            import asyncio  # noqa: F401
    except BaseException:
        pass
    while True:
        try:
            line = requests.readline()
        except KeyboardInterrupt:
            continue
        except OSError:
            break
        if not line:
            break  # execd closed the requests pipe: exit
        try:
            msg = loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict) or msg.get("type") != "execute":
            continue
        source = msg.get("code")
        try:
            run(str(msg.get("id")), source if isinstance(source, str) else "")
        except OSError:
            break  # the replies pipe is gone: execd no longer listens
        except BaseException:
            continue
    flush_std()
    os._exit(0)


_main()
