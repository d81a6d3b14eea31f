"""execd's python driver: the interpreter behind one python code context.

execd runs this file as `python3 -u -P python.py`: fd 0 is /dev/null, fds 1 and 2
are the pipes execd streams as stdout and stderr, fd 3 carries requests (one JSON
object per line), fd 4 carries replies (likewise), and fd 5, the javascript
driver's interrupt pipe, is not used (execd interrupts python with SIGINT). The
messages are those of execd's driver protocol: ready once, then for every execute
request zero or more display messages, at most one result, at most one error, and
always a done last.

Everything lives inside _main, so the user's namespace (a fresh __main__ module)
holds nothing of the driver, and frames of the driver are told from the user's by
their globals.
"""

import os
import sys


def _main():
    import ast
    import builtins
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
    dumps, loads = json.dumps, json.loads

    class S:
        """The driver's state (a class used as a namespace)."""

        run_id = None  # id of the run in progress, None between runs
        count = 0  # execution_count of the last run
        busy = False  # SIGINT raises KeyboardInterrupt only while set
        critical = 0  # > 0 while the main thread writes a reply
        pending = False  # a SIGINT arrived during such a write
        shown = {}  # id(figure) -> figure displayed during this run
        loop = None  # the context's asyncio loop, made at the first await
        pyplot = False  # matplotlib.pyplot has been imported and patched
        sources = []  # linecache names of the cells kept

    S.driver_module = sys.modules["__main__"]
    write_lock = _thread.allocate_lock()

    # ---- replies ---------------------------------------------------------

    def encode(msg):
        try:
            return dumps(msg, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as e:
            # Formatting checks every value, so this is a driver bug; still,
            # the run must get its message.
            note = "execd: cannot encode the %s message: %s" % (msg.get("type"), e)
            if "data" in msg:
                msg = dict(msg, data={"text/plain": note})
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
        import io

        buf = io.BytesIO()
        try:
            fig.savefig(buf, format="png", bbox_inches="tight")
        except Exception:
            return None
        return b2a_base64(buf.getvalue(), newline=False).decode("ascii")

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
        return data

    def display(*objs, **kwargs):
        """Shows each object as rich output of the run in progress, as
        Jupyter's display() does."""
        for obj in objs:
            rid = S.run_id
            if rid is None:
                return  # between runs there is no one to show it to
            data = fmt(obj)
            if is_figure(obj):
                S.shown[id(obj)] = obj
            write_reply({"type": "display", "id": rid, "data": data})

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

    class PatchingLoader:
        """Runs pyplot's own loader, then patches the module."""

        def __init__(self, loader):
            self._loader = loader

        def __getattr__(self, name):
            return getattr(self._loader, name)

        def create_module(self, spec):
            return self._loader.create_module(spec)

        def exec_module(self, module):
            self._loader.exec_module(module)
            patch_pyplot(module)

    class PyplotFinder:
        """An import hook that sees matplotlib.pyplot get imported, so that
        matplotlib itself is never imported by the driver."""

        def find_spec(self, name, path=None, target=None):
            if name != "matplotlib.pyplot":
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
                return None
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = PatchingLoader(spec.loader)
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

    # ---- execution ---------------------------------------------------------

    main = type(sys)("__main__")
    main.__dict__["__builtins__"] = builtins
    ns = main.__dict__

    def run_coroutine(coro):
        if S.loop is None:
            import asyncio

            S.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(S.loop)
        task = S.loop.create_task(coro)
        try:
            return S.loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                # Interrupted while the loop waited: unwind the task so that
                # the next run does not resume it.
                task.cancel()
                try:
                    S.loop.run_until_complete(task)
                except BaseException:
                    pass
            raise

    def run_code(code):
        if code.co_flags & CO_COROUTINE:
            return run_coroutine(eval(code, ns))
        return eval(code, ns)

    def remember_source(filename, source):
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        S.sources.append(filename)
        if len(S.sources) > KEEP_SOURCES:
            linecache.cache.pop(S.sources.pop(0), None)

    def execute(source, n):
        """Runs a cell; returns the value of its last expression statement,
        None when it has none."""
        filename = "<cell-%d>" % n
        remember_source(filename, source)
        tree = ast.parse(source, filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        if tree.body:
            run_code(compile(tree, filename, "exec", COMPILE_FLAGS, True))
        if last is not None:
            return run_code(compile(last, filename, "eval", COMPILE_FLAGS, True))
        return None

    def format_traceback(e):
        import traceback

        # The frames before the first one of the user's code are the driver's.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_globals is not ns:
            tb = tb.tb_next
        try:
            lines = traceback.format_exception(type(e), e, tb)
        except Exception:
            lines = ["%s: %s\n" % (type(e).__name__, safe_str(e))]
        return "".join(lines).splitlines()

    def send_error(rid, e):
        write_reply(
            {
                "type": "error",
                "id": rid,
                "ename": type(e).__name__,
                "evalue": safe_str(e),
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
    sys.meta_path.insert(0, PyplotFinder())
    sys.modules["__main__"] = main
    sys.argv = [""]
    # Like an interactive interpreter, the user's code imports modules from
    # the current directory; the driver's own imports above could not.
    sys.path.insert(0, "")

    requests = os.fdopen(REQUESTS, "rb")
    write_reply({"type": "ready", "language": "python", "version": "%d.%d.%d" % sys.version_info[:3]})
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
