// execd's java driver: the interpreter behind one java code context.
//
// execd runs this file as a single-file source program (`java ... java.java`,
// JDK 11 or later, no dependencies beyond the jdk.jshell module): fd 0 is
// /dev/null, fds 1 and 2 are the pipes execd streams as stdout and stderr,
// fd 3 carries requests (one JSON object per line), fd 4 carries replies
// (likewise) and fd 5 carries interrupts (one byte per request to interrupt
// the run in progress). The messages are those of execd's driver protocol:
// ready once, then for every execute request a started, at most one result,
// at most one error, and always a done last.
//
// How code runs. Cells are evaluated by the JDK's JShell with its local
// execution engine: the snippets run in this JVM, on a thread JShell owns,
// so a cell costs no round trip to a second JVM. A cell is cut into snippets
// as jshell cuts what is typed (a missing semicolon after the last one is
// added); the snippets are evaluated in order, and the first that fails to
// compile or throws ends the cell. Imports, classes, methods and variables
// persist, and may be declared again by a later cell, as in jshell. The
// value of the last snippet, when it is an expression, is the cell's result,
// in jshell's notation ("2", "\"text\"").
//
// Output. What the code prints with System.out and System.err goes to fds
// 1 and 2; both are flushed before done is written.
//
// Interrupts. A thread reads fd 5 and calls JShell.stop(), which stops the
// snippet running (even an endless loop or a sleep), again until the run
// is over, since a snippet may start after the first call; the run ends with an
// Interrupted error and the context keeps its state. The main thread writes
// a mark ("S<run>.") into the same pipe when a run starts: an interrupt read
// before the mark of the run in progress was meant for an earlier run and is
// ignored.

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

class OsbJavaDriver {
    static final String REQUESTS = "/proc/self/fd/3";
    static final String REPLIES = "/proc/self/fd/4";
    static final String INTERRUPTS = "/proc/self/fd/5";

    // maxLine is the longest reply line written, within the 16 MiB execd
    // accepts (characters; a result is cut to fit).
    static final int maxValue = 4 << 20;

    static OutputStream replies;
    static JShell shell;

    // The run in progress (0: none) and the run whose start mark the
    // interrupt thread read last.
    static volatile long running;
    static volatile long armed = -1;
    static volatile boolean stopped;

    public static void main(String[] args) throws Exception {
        replies = new FileOutputStream(REPLIES);
        BufferedReader requests = new BufferedReader(
                new InputStreamReader(new FileInputStream(REQUESTS), StandardCharsets.UTF_8));
        OutputStream marks = null;
        try {
            marks = new FileOutputStream(INTERRUPTS);
        } catch (IOException e) {
            // No /proc or fd 5 is no pipe: every interrupt then counts.
        }
        boolean marked = marks != null;

        JShell.Builder b = JShell.builder().executionEngine("local")
                .out(System.out).err(System.err);
        shell = b.build();
        String cp = System.getenv("CLASSPATH");
        if (cp != null) {
            for (String p : cp.split(":")) {
                if (!p.isEmpty()) shell.addToClasspath(p);
            }
        }
        // Compile something once so that the first cell does not pay for
        // loading the compiler.
        shell.eval("int $osbWarm = 0;");
        for (Snippet s : shell.snippets().toList()) shell.drop(s);

        Thread t = new Thread(() -> readInterrupts(marked), "osb-interrupts");
        t.setDaemon(true);
        t.start();

        writeLine("{\"type\":\"ready\",\"language\":\"java\",\"version\":" + quote(Runtime.version().toString()) + "}");

        long seq = 0;
        int count = 0;
        String line;
        while ((line = requests.readLine()) != null) {
            Map<String, String> msg = parseRequest(line);
            if (msg == null || !"execute".equals(msg.get("type"))) continue;
            String id = msg.getOrDefault("id", "");
            String code = msg.getOrDefault("code", "");
            count++;
            seq++;
            stopped = false;
            running = seq;
            if (marks != null) {
                try {
                    marks.write(("S" + seq + ".").getBytes(StandardCharsets.US_ASCII));
                    marks.flush();
                } catch (IOException e) {
                    // A full pipe: this run cannot be interrupted.
                }
            }
            writeLine("{\"type\":\"started\",\"id\":" + quote(id) + "}");
            String reply;
            try {
                reply = execute(id, count, code);
            } catch (Throwable e) {
                reply = error(id, e.getClass().getName(), String.valueOf(e.getMessage()), List.of(String.valueOf(e)));
            }
            running = 0;
            System.out.flush();
            System.err.flush();
            if (stopped) {
                reply = error(id, "Interrupted", "execution was interrupted", List.of("Interrupted: execution was interrupted"));
            }
            if (reply != null) writeLine(reply);
            writeLine("{\"type\":\"done\",\"id\":" + quote(id) + ",\"execution_count\":" + count + "}");
        }
        System.exit(0);
    }

    // readInterrupts stops the run in progress for each "\n" read from fd 5
    // after the run's start mark.
    static void readInterrupts(boolean marked) {
        try (InputStream in = new FileInputStream(INTERRUPTS)) {
            StringBuilder mark = null;
            int c;
            while ((c = in.read()) >= 0) {
                if (mark != null) {
                    if (c == '.') {
                        try {
                            armed = Long.parseLong(mark.toString());
                        } catch (NumberFormatException e) {
                            armed = -1;
                        }
                        mark = null;
                    } else if (mark.length() < 20) {
                        mark.append((char) c);
                    }
                } else if (c == 'S') {
                    mark = new StringBuilder();
                } else if (c == '\n') {
                    long r = running;
                    if (r != 0 && (!marked || armed == r)) {
                        stopped = true;
                        // stop() does nothing while no snippet runs (the
                        // cell's next snippet may be compiling): again
                        // until the run is over.
                        while (running == r) {
                            shell.stop();
                            try {
                                Thread.sleep(20);
                            } catch (InterruptedException e) {
                                return;
                            }
                        }
                    }
                }
            }
        } catch (IOException e) {
            System.err.println("execd java driver: reading the interrupt pipe: " + e.getMessage());
        }
    }

    // execute runs one cell and returns its result or error reply, or null.
    static String execute(String id, int count, String cell) {
        SourceCodeAnalysis sca = shell.sourceCodeAnalysis();
        String rest = cell;
        int consumed = 0; // offset of rest in cell
        String result = null;
        while (!rest.isBlank()) {
            SourceCodeAnalysis.CompletionInfo ci = sca.analyzeCompletion(rest);
            String src;
            switch (ci.completeness()) {
                case EMPTY:
                    return result;
                case DEFINITELY_INCOMPLETE:
                case CONSIDERED_INCOMPLETE:
                case UNKNOWN:
                    // What is left does not make a snippet: compile it as it
                    // is to report why.
                    src = rest;
                    break;
                default:
                    src = ci.source();
            }
            String remaining = src == rest ? "" : ci.remaining();
            int start = snippetStart(rest, src);
            int offset = consumed + start;
            consumed += rest.length() - remaining.length();
            rest = remaining;
            result = null;

            List<SnippetEvent> events = shell.eval(src);
            if (stopped) return null;
            for (SnippetEvent ev : events) {
                if (ev.causeSnippet() != null) continue; // an update of another snippet
                Snippet sn = ev.snippet();
                if (ev.status() == Snippet.Status.REJECTED) {
                    return compileError(id, cell, offset, sn);
                }
                JShellException ex = ev.exception();
                if (ex != null) return exception(id, ex);
                if (isExpression(sn) && ev.value() != null) {
                    result = ev.value();
                } else {
                    result = null;
                }
            }
        }
        if (result == null) return null;
        if (result.length() > maxValue) {
            result = result.substring(0, maxValue) + "... (" + (result.length() - maxValue) + " more characters)";
        }
        return "{\"type\":\"result\",\"id\":" + quote(id) + ",\"execution_count\":" + count
                + ",\"data\":{\"text/plain\":" + quote(result) + "}}";
    }

    // snippetStart returns where src, the snippet jshell cut from the start
    // of rest, begins in rest.
    static int snippetStart(String rest, String src) {
        int k = rest.indexOf(src);
        if (k < 0 && src.endsWith(";")) k = rest.indexOf(src.substring(0, src.length() - 1));
        if (k >= 0) return k;
        String head = src.strip();
        if (head.endsWith(";")) head = head.substring(0, head.length() - 1);
        int nl = head.indexOf('\n');
        if (nl >= 0) head = head.substring(0, nl);
        int i = head.isEmpty() ? -1 : rest.indexOf(head);
        if (i >= 0) return i;
        int j = 0;
        while (j < rest.length() && Character.isWhitespace(rest.charAt(j))) j++;
        return j;
    }

    // isExpression reports whether a snippet is an expression whose value
    // is the cell's result: a bare expression, or the temporary variable
    // ($1) jshell makes of one.
    static boolean isExpression(Snippet sn) {
        switch (sn.subKind()) {
            case TEMP_VAR_EXPRESSION_SUBKIND:
            case VAR_VALUE_SUBKIND:
            case ASSIGNMENT_SUBKIND:
            case OTHER_EXPRESSION_SUBKIND:
                return true;
            default:
                return false;
        }
    }

    // compileError reports a snippet that did not compile: each error with
    // its line in the cell, the line and a caret under its position.
    static String compileError(String id, String cell, int offset, Snippet sn) {
        List<String> tb = new ArrayList<>();
        String first = null;
        for (Diag d : shell.diagnostics(sn).toList()) {
            if (!d.isError()) continue;
            String msg = d.getMessage(Locale.ROOT);
            if (first == null) first = msg.split("\n", 2)[0];
            long pos = d.getPosition();
            if (pos < 0) pos = d.getStartPosition();
            int at = (int) Math.max(0, Math.min(cell.length(), offset + Math.max(0, pos)));
            int lineStart = cell.lastIndexOf('\n', at - 1) + 1;
            int lineEnd = cell.indexOf('\n', at);
            if (lineEnd < 0) lineEnd = cell.length();
            int lineNo = 1;
            for (int i = 0; i < lineStart; i++) {
                if (cell.charAt(i) == '\n') lineNo++;
            }
            tb.add("cell line " + lineNo + ": " + msg.replace("\n", " "));
            tb.add(cell.substring(lineStart, lineEnd));
            tb.add(" ".repeat(at - lineStart) + "^");
        }
        if (first == null) {
            // Rejected without an error: a snippet jshell does not take
            // (a package declaration, a stray modifier).
            first = "the snippet was rejected: " + sn.source().strip();
            tb.add(first);
        }
        return error(id, "CompilationException", first, tb);
    }

    static final Pattern SNIPPET_FILE = Pattern.compile("#\\d+");

    // exception reports an exception the code threw: its class and message,
    // and a stack trace without the frames of JShell's machinery (those
    // below the last frame of a snippet).
    static String exception(String id, JShellException ex) {
        String ename;
        String evalue = ex.getMessage() == null ? "" : ex.getMessage();
        if (ex instanceof EvalException) {
            ename = ((EvalException) ex).getExceptionClassName();
        } else if (ex instanceof UnresolvedReferenceException) {
            ename = "UnresolvedReferenceException";
            Snippet sn = ((UnresolvedReferenceException) ex).getSnippet();
            List<String> missing = shell.unresolvedDependencies((jdk.jshell.DeclarationSnippet) sn).toList();
            evalue = "it cannot be used until " + String.join(", ", missing) + " is declared";
        } else {
            ename = ex.getClass().getName();
        }
        List<String> tb = new ArrayList<>();
        Throwable t = ex;
        String prefix = "";
        while (t != null) {
            String name = t instanceof EvalException ? ((EvalException) t).getExceptionClassName()
                    : t == ex ? ename : t.getClass().getName();
            String msg = t == ex ? evalue : t.getMessage();
            tb.add(prefix + name + (msg == null || msg.isEmpty() ? "" : ": " + msg));
            StackTraceElement[] st = t.getStackTrace();
            int last = -1;
            for (int i = 0; i < st.length; i++) {
                String f = st[i].getFileName();
                if (f != null && SNIPPET_FILE.matcher(f).matches()) last = i;
            }
            for (int i = 0; i <= last; i++) tb.add("\tat " + frame(st[i]));
            t = t.getCause();
            prefix = "Caused by: ";
        }
        return error(id, ename, evalue, tb);
    }

    // frame formats a stack frame; snippets' classes are jshell's
    // wrappers (REPL.$JShell$12$), which say nothing to the user.
    static String frame(StackTraceElement e) {
        String cls = e.getClassName();
        Matcher m = Pattern.compile("^REPL\\.\\$JShell\\$\\d+[A-Z]?\\$\\.?").matcher(cls);
        String where = m.find() ? cls.substring(m.end()) : cls;
        String method = e.getMethodName();
        String name = where.isEmpty() ? method : where + "." + method;
        if (e.getFileName() == null) return name + "(Unknown Source)";
        return name + "(" + e.getFileName() + (e.getLineNumber() > 0 ? ":" + e.getLineNumber() : "") + ")";
    }

    static String error(String id, String ename, String evalue, List<String> traceback) {
        StringBuilder sb = new StringBuilder("{\"type\":\"error\",\"id\":").append(quote(id))
                .append(",\"ename\":").append(quote(ename))
                .append(",\"evalue\":").append(quote(evalue))
                .append(",\"traceback\":[");
        for (int i = 0; i < traceback.size(); i++) {
            if (i > 0) sb.append(',');
            sb.append(quote(traceback.get(i)));
        }
        return sb.append("]}").toString();
    }

    // writeLine writes one reply line whole; execd gone means exit.
    static synchronized void writeLine(String line) {
        try {
            replies.write((line + "\n").getBytes(StandardCharsets.UTF_8));
            replies.flush();
        } catch (IOException e) {
            System.exit(0);
        }
    }

    // ---- JSON ---------------------------------------------------------------

    static String quote(String s) {
        StringBuilder sb = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default:
                    if (c < 0x20 || Character.isSurrogate(c) && !validSurrogate(s, i)) {
                        sb.append(String.format("\\u%04x", c < 0x20 ? (int) c : 0xfffd));
                    } else {
                        sb.append(c);
                    }
            }
        }
        return sb.append('"').toString();
    }

    static boolean validSurrogate(String s, int i) {
        char c = s.charAt(i);
        if (Character.isHighSurrogate(c)) return i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1));
        return i > 0 && Character.isHighSurrogate(s.charAt(i - 1));
    }

    // parseRequest decodes a request: one flat JSON object whose values are
    // strings (execd's requests are such), or null.
    static Map<String, String> parseRequest(String line) {
        Map<String, String> m = new java.util.HashMap<>();
        int[] pos = {skip(line, 0)};
        if (pos[0] >= line.length() || line.charAt(pos[0]) != '{') return null;
        pos[0] = skip(line, pos[0] + 1);
        if (pos[0] < line.length() && line.charAt(pos[0]) == '}') return m;
        for (;;) {
            String k = string(line, pos);
            if (k == null) return null;
            pos[0] = skip(line, pos[0]);
            if (pos[0] >= line.length() || line.charAt(pos[0]) != ':') return null;
            pos[0] = skip(line, pos[0] + 1);
            String v = string(line, pos);
            if (v == null) return null;
            m.put(k, v);
            pos[0] = skip(line, pos[0]);
            if (pos[0] >= line.length()) return null;
            char c = line.charAt(pos[0]);
            if (c == '}') return m;
            if (c != ',') return null;
            pos[0] = skip(line, pos[0] + 1);
        }
    }

    static int skip(String s, int i) {
        while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
        return i;
    }

    // string reads a JSON string at pos[0] and moves pos[0] past it.
    static String string(String s, int[] pos) {
        int i = pos[0];
        if (i >= s.length() || s.charAt(i) != '"') return null;
        StringBuilder sb = new StringBuilder();
        for (i++; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"') {
                pos[0] = i + 1;
                return sb.toString();
            }
            if (c != '\\') {
                sb.append(c);
                continue;
            }
            if (++i >= s.length()) return null;
            switch (s.charAt(i)) {
                case '"': sb.append('"'); break;
                case '\\': sb.append('\\'); break;
                case '/': sb.append('/'); break;
                case 'b': sb.append('\b'); break;
                case 'f': sb.append('\f'); break;
                case 'n': sb.append('\n'); break;
                case 'r': sb.append('\r'); break;
                case 't': sb.append('\t'); break;
                case 'u':
                    if (i + 4 >= s.length()) return null;
                    try {
                        sb.append((char) Integer.parseInt(s.substring(i + 1, i + 5), 16));
                    } catch (NumberFormatException e) {
                        return null;
                    }
                    i += 4;
                    break;
                default:
                    return null;
            }
        }
        return null;
    }
}
