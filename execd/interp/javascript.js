// execd's javascript driver: the interpreter behind one javascript code context,
// and behind one typescript context when its argument is "typescript": each cell
// is then transpiled with the typescript module (types erased, not checked) and
// run as a javascript cell (see transpile).
//
// execd runs this file as `node --no-warnings javascript.js` (CommonJS, Node 18
// or later, no dependencies): fd 0 is /dev/null, fds 1 and 2 are the pipes
// execd streams as stdout and stderr, fd 3 carries requests (one JSON object per
// line), fd 4 carries replies (likewise) and fd 5 carries interrupts (one byte
// per request to interrupt the run in progress). The messages are those of
// execd's driver protocol: ready once, then for every execute request zero or
// more display messages, at most one result, at most one error, and always a
// done last.
//
// How code runs. Each cell is evaluated by V8's inspector, through an
// in-process inspector.Session, with Runtime.evaluate in REPL mode, the mode
// of the browsers' consoles: top-level await works, top-level let, const and
// class declarations persist and may be declared again in a later cell, and
// the cell's completion value is its result. The vm module offers none of
// this (a let could not be declared twice, and await would need the source
// rewrite node's own REPL does with a parser this driver does not have). The
// inspector answers with remote objects; the driver gets the values behind
// them with Runtime.callFunctionOn and a capturing function of its own, so
// results and errors are formatted from the real values. A cell starting with
// "{" that parses as an object literal is evaluated as one, as in node's REPL.
// Dynamic import() is not available to cells (V8 gives scripts evaluated by
// the inspector no module loader); require() is.
//
// Interrupts. A worker thread reads fd 5. For each interrupt it stops the run
// in progress with Runtime.terminateExecution, sent through an inspector
// session of its own connected to the main thread: V8 breaks into the
// JavaScript running there, even an endless loop, unwinds it and lets the
// main thread go on with the context's state kept. A cell that waits (a
// pending await) has no JavaScript running: the termination is then a no-op
// and the driver ends the run all the same; what the cell awaited may still
// settle later, in the background, as in node's REPL. The two threads agree
// through one 32-bit word in shared memory holding the run's sequence number
// and its phase, changed by compare-and-swap only: the worker terminates only
// while the run's code may be running, never while the driver writes a
// reply, and when a run's end and an interrupt cross, exactly one of them
// ends the run. An interrupt while no run is in progress is ignored, and so
// is one sent for a run that has ended (the main thread writes a mark into
// the interrupt pipe when a run starts; interrupts read before it are
// stale).
//
// What an interrupt cannot do. A termination unwinds node's own JavaScript
// too, skipping its finally blocks, when it lands in a callback node calls
// (a timer, an immediate, an I/O callback) rather than in the cell or a
// promise continuation of it. Node copes with most of it (the driver turns
// off node's check of async contexts, which would abort, and resets them);
// not with an immediate stopped after another one of the same turn, after
// which node cannot run immediates again: the driver then exits (the
// context dies) rather than spin. A termination also drops the promise
// continuations queued at that moment. Code left running in the background
// by an earlier run (a timer, an abandoned await) is no run: an endless loop
// there blocks the context until execd kills it. Code blocked in a
// synchronous call (execSync, Atomics.wait) stops only when the call returns.
//
// Output. process.stdout and process.stderr write synchronously (on a pipe
// node writes asynchronously), so what the code printed is in the pipes when
// the driver writes done. Replies are written by the main thread only, one
// whole line per synchronous write loop, never while an interrupt may land.
//
// Node marks every inherited descriptor up to fd 15 close-on-exec at startup,
// so processes the code spawns do not inherit fds 3, 4 and 5.

'use strict';

const fs = require('fs');
const path = require('path');
const util = require('util');
const inspector = require('inspector');
const net = require('net');
const { Worker } = require('worker_threads');
const Module = require('module');

const REQUESTS = 3;
const REPLIES = 4;
const INTERRUPTS = 5;

// maxLine is the longest reply line this driver writes, within the 16 MiB
// execd accepts.
const maxLine = 15 << 20;
// maxResultJSON bounds the application/json copy of a result, sent besides
// its text/plain when the value is plain data.
const maxResultJSON = 1 << 20;

// Phases of the shared state word (low 3 bits; the run's sequence number is
// in the others).
const IDLE = 0; // no run: interrupts are ignored
const RUNNING = 1; // the run's code may be running: the worker may terminate it
const WRITING = 2; // the main thread writes a reply: the worker must wait
const WRITING_INTERRUPTED = 3; // as WRITING, and an interrupt waits for its end
const TERMINATING = 4; // the worker is terminating the run; it ends the run

const SEQ_MASK = 0x0fffffff;

function word(seq, phase) {
  return ((seq & SEQ_MASK) << 3) | phase;
}

// interrupter is the worker thread's program (it runs from its source text,
// so it uses nothing of this file's scope). It reads the interrupt pipe as a
// stream and never blocks: its event loop must stay free to get the answers
// of the main thread's inspector.
function interrupter(data) {
  'use strict';
  const fs = require('fs');
  const net = require('net');
  const inspector = require('inspector');
  const { parentPort } = require('worker_threads');
  const { shared, fd, marked, phases } = data;
  const { IDLE, RUNNING, WRITING, WRITING_INTERRUPTED, TERMINATING } = phases;
  const st = new Int32Array(shared);
  const phaseOf = (w) => w & 7;
  const seqOf = (w) => w >>> 3;
  let busy = -1; // the run being interrupted
  let armed = -1; // the run whose start mark was read last
  let mark = null; // digits of a start mark being read

  function warn(msg) {
    try {
      fs.writeSync(2, 'execd javascript driver: ' + msg + '\n');
    } catch (e) {
      // stderr is gone: nothing to tell
    }
  }

  // terminate stops the JavaScript running on the main thread, if any, then
  // has the main thread end run seq. The session lives only for this: one
  // left connected would make node wait for it at exit.
  function terminate(seq) {
    let session;
    try {
      session = new inspector.Session();
      session.connectToMainThread();
    } catch (e) {
      // No inspector: a run that waits still ends; one that computes runs on.
      warn('terminating the run: ' + e.message);
      ended(seq);
      return;
    }
    session.post('Runtime.terminateExecution', (err) => {
      if (err) warn('terminating the run: ' + err.message);
      // V8 may answer before the termination has hit anything, when no
      // JavaScript was running: it then hits the next JavaScript to run.
      // This throwaway expression is that one, not the driver's code.
      session.post('Runtime.evaluate', { expression: '0' }, () => {
        session.disconnect();
        ended(seq);
      });
    });
  }

  // ended tells the main thread that run seq was terminated, again until it
  // has ended the run (a message handler that a termination stopped loses
  // its message).
  function ended(seq) {
    const w = Atomics.load(st, 0);
    if (seqOf(w) !== seq || phaseOf(w) !== TERMINATING) return;
    parentPort.postMessage(seq);
    setTimeout(ended, 100, seq);
  }

  // interrupt acts on run target, if it is in progress (-1: whatever run is
  // in progress).
  function interrupt(target) {
    for (;;) {
      const w = Atomics.load(st, 0);
      const seq = seqOf(w);
      const phase = phaseOf(w);
      if (target >= 0 && seq !== target) return; // it has ended
      if (seq === busy && phase !== IDLE) return; // being interrupted already
      busy = -1;
      switch (phase) {
        case RUNNING:
          if (Atomics.compareExchange(st, 0, w, (w & ~7) | TERMINATING) !== w) continue;
          busy = seq;
          terminate(seq);
          return;
        case WRITING:
          // The main thread tells when its write is over.
          if (Atomics.compareExchange(st, 0, w, (w & ~7) | WRITING_INTERRUPTED) !== w) continue;
          busy = seq;
          return;
        default:
          // IDLE: nothing to interrupt. TERMINATING, WRITING_INTERRUPTED:
          // only this thread sets them, and it is then busy with the run.
          return;
      }
    }
  }

  // The main thread's write that held back an interrupt of run seq is over.
  parentPort.on('message', (seq) => {
    if (busy === seq) {
      busy = -1;
      interrupt(seq);
    }
  });

  // The pipe carries execd's interrupts ("\n") and the main thread's start
  // marks ("S<run>."), written when a run starts. An interrupt read before
  // the mark of the run in progress was sent before it started: stale.
  function read(chunk) {
    for (const c of chunk) {
      if (mark !== null) {
        if (c === 0x2e) {
          armed = Number(mark);
          mark = null;
        } else if (mark.length < 12) {
          mark += String.fromCharCode(c);
        }
      } else if (c === 0x53) {
        mark = '';
      } else if (c === 0x0a && !marked) {
        interrupt(-1);
      } else if (c === 0x0a && armed >= 0) {
        interrupt(armed);
      }
    }
  }

  const pipe = new net.Socket({ fd, readable: true, writable: false });
  pipe.on('data', read);
  pipe.on('error', (e) => warn('reading the interrupt pipe: ' + e.message));
  pipe.on('end', () => pipe.destroy());
}

function main() {
  // The language of the context: javascript, or typescript when execd
  // passes it as the driver's argument.
  const language = process.argv[2] === 'typescript' ? 'typescript' : 'javascript';
  const st = new Int32Array(new SharedArrayBuffer(4));
  const nap = new Int32Array(new SharedArrayBuffer(4));
  const phaseOf = (w) => w & 7;
  const driverFile = __filename;

  // ---- replies ------------------------------------------------------------

  // Raw holds text that is already JSON, spliced into a reply as it is.
  class Raw {
    constructor(text) {
      this.text = text;
    }
  }

  function encodeData(data) {
    const parts = [];
    for (const mime of Object.keys(data)) {
      const v = data[mime];
      parts.push(JSON.stringify(mime) + ':' + (v instanceof Raw ? v.text : JSON.stringify(v)));
    }
    return '{' + parts.join(',') + '}';
  }

  // encode returns msg as one JSON line (without the newline); data values
  // may be Raw.
  function encode(msg) {
    const parts = [];
    for (const key of Object.keys(msg)) {
      const v = msg[key];
      parts.push(JSON.stringify(key) + ':' + (key === 'data' ? encodeData(v) : JSON.stringify(v)));
    }
    return '{' + parts.join(',') + '}';
  }

  // writeAll writes b whole to fd, waiting when the pipe is full; it
  // returns false when fd cannot be written.
  function writeAll(fd, b) {
    let off = 0;
    while (off < b.length) {
      try {
        off += fs.writeSync(fd, b, off, b.length - off);
      } catch (e) {
        if (e.code === 'EAGAIN') {
          Atomics.wait(nap, 0, 0, 1);
        } else if (e.code !== 'EINTR') {
          return false;
        }
      }
    }
    return true;
  }

  // writeLine writes one reply line whole. A replies pipe that is gone means
  // execd no longer listens: the driver exits.
  function writeLine(line) {
    if (!writeAll(REPLIES, Buffer.from(line + '\n', 'utf8'))) process.exit(0);
  }

  // ---- formatting ---------------------------------------------------------

  function safeString(v) {
    try {
      return String(v);
    } catch (e) {
      return '[' + typeof v + ']';
    }
  }

  function inspect(v) {
    try {
      return util.inspect(v);
    } catch (e) {
      return '[value that cannot be inspected: ' + safeString(e && e.message) + ']';
    }
  }

  function isPlainObject(v) {
    const proto = Object.getPrototypeOf(v);
    return proto === Object.prototype || proto === null;
  }

  // plainJSON returns the JSON text of v when v is plain data (arrays,
  // plain objects, strings, finite numbers, booleans, null, no getters, no
  // cycles) of at most maxBytes, else undefined. It never runs the value's
  // own code.
  function plainJSON(v, maxBytes) {
    if (v === null || typeof v !== 'object' || util.types.isProxy(v)) return undefined;
    if (!Array.isArray(v) && !isPlainObject(v)) return undefined;
    let budget = 100000;
    const ancestors = new Set();
    function ok(x, depth) {
      if (--budget < 0 || depth > 100) return false;
      switch (typeof x) {
        case 'string':
        case 'boolean':
          return true;
        case 'number':
          return Number.isFinite(x);
        case 'object':
          break;
        default:
          return false;
      }
      if (x === null) return true;
      if (util.types.isProxy(x) || ancestors.has(x)) return false;
      const arr = Array.isArray(x);
      if (arr ? x.length > budget : !isPlainObject(x)) return false;
      const keys = Object.keys(x);
      if (arr && keys.length !== x.length) return false; // holes, or more than items
      ancestors.add(x);
      for (const k of keys) {
        const d = Object.getOwnPropertyDescriptor(x, k);
        if (!d || !('value' in d) || !ok(d.value, depth + 1)) return false;
      }
      ancestors.delete(x);
      return true;
    }
    if (!ok(v, 0)) return undefined;
    let text;
    try {
      text = JSON.stringify(v);
    } catch (e) {
      return undefined;
    }
    return text !== undefined && text.length <= maxBytes ? text : undefined;
  }

  // bundle returns the MIME bundle of a value: text/plain always, and
  // application/json when the value is plain data.
  function bundle(v) {
    const data = { 'text/plain': inspect(v) };
    const json = plainJSON(v, maxResultJSON);
    if (json !== undefined) data['application/json'] = new Raw(json);
    return data;
  }

  function isError(e) {
    try {
      return util.types.isNativeError(e) || e instanceof Error;
    } catch (err) {
      return false;
    }
  }

  // cleanStack returns the lines of an error's stack without the driver's
  // frames: those from the inspector call that ran the cell down, and those
  // of this file (display's helpers).
  function cleanStack(stack) {
    const lines = stack.split('\n');
    const out = [];
    for (const line of lines) {
      if (/^\s+at /.test(line)) {
        if (/\bSession\.post \(node:inspector[:)]/.test(line)) break;
        if (line.includes(driverFile)) continue;
      }
      out.push(line);
    }
    return out;
  }

  // errorReply builds the error message of a run from a thrown value;
  // location, when set, is where a cell failed to compile.
  function errorReply(id, e, location) {
    let ename = 'Error';
    let evalue;
    let traceback;
    if (isError(e)) {
      let stack;
      try {
        ename = safeString(e.name);
        evalue = safeString(e.message);
        stack = e.stack;
      } catch (err) {
        evalue = evalue === undefined ? '' : evalue;
      }
      traceback = typeof stack === 'string' ? cleanStack(stack) : [ename + ': ' + evalue];
    } else {
      evalue = safeString(e);
      traceback = ['Uncaught ' + inspect(e)];
    }
    if (location) traceback = location.concat(traceback);
    return { type: 'error', id, ename, evalue, traceback };
  }

  // syntaxLocation returns the lines that show where a cell failed to
  // compile, as node prints an uncaught SyntaxError.
  function syntaxLocation(name, code, details) {
    let line = details.lineNumber;
    let col = details.columnNumber;
    if (typeof line !== 'number' || typeof col !== 'number') return undefined;
    const lines = code.split('\n');
    if (line >= lines.length) {
      // Past the end of the cell (on the line that names it): its end.
      line = lines.length - 1;
      col = lines[line].length;
    }
    const src = lines[line];
    return [name + ':' + (line + 1), src, ' '.repeat(Math.min(col, src.length)) + '^', ''];
  }

  // ---- evaluation ---------------------------------------------------------

  const session = new inspector.Session();
  session.connect();

  // The capturing function, known to the inspector by an object id: calling
  // it on a remote object hands the driver the value behind it.
  const NONE = Symbol('none');
  let captured = NONE;
  let captureId;
  globalThis.__osbCapture = (v) => {
    captured = v;
  };
  session.post('Runtime.evaluate', { expression: 'globalThis.__osbCapture', objectGroup: 'osb-driver' }, (err, res) => {
    if (!err && res.result) captureId = res.result.objectId;
  });
  delete globalThis.__osbCapture;
  if (captureId === undefined) throw new Error('cannot set up the inspector session');

  // valueOf returns the value a remote object of run r stands for, or NONE.
  function valueOf(r, ro) {
    if (!ro) return NONE;
    if (ro.objectId === undefined) {
      if (ro.type === 'undefined') return undefined;
      const u = ro.unserializableValue;
      if (u !== undefined) {
        if (ro.type === 'bigint') return BigInt(u.slice(0, -1));
        return Number(u);
      }
      return 'value' in ro ? ro.value : NONE;
    }
    captured = NONE;
    session.post('Runtime.callFunctionOn', {
      objectId: ro.objectId,
      functionDeclaration: 'function (capture) { "use strict"; capture(this); }',
      arguments: [{ objectId: captureId }],
      objectGroup: group(r),
    });
    const v = captured;
    captured = NONE;
    return v;
  }

  // group names the inspector's objects of run r, released together.
  function group(r) {
    return 'run-' + r.seq;
  }

  function release(r) {
    session.post('Runtime.releaseObjectGroup', { objectGroup: group(r) });
  }

  let vm; // loaded when a cell starts with "{"

  // objectLiteral returns "(code)" when code reads as an object literal
  // (it starts with "{", does not end with ";" and parses in parentheses).
  function objectLiteral(code) {
    if (!/^\s*\{/.test(code) || /;\s*$/.test(code)) return undefined;
    const wrapped = '(' + code + '\n)';
    vm = vm || require('vm');
    try {
      new vm.Script('(async () => ' + wrapped + ')');
    } catch (e) {
      return undefined;
    }
    return wrapped;
  }

  let count = 0; // execution_count of the last run
  let seq = 0; // sequence number of the last run
  let run = null; // the run in progress: { id, n, seq, ended }
  const queue = []; // requests waiting for the run in progress to end

  // markFd writes the start marks of runs into the interrupt pipe (see
  // interrupter). It is -1 without /proc: every interrupt then counts.
  let markFd = -1;
  try {
    markFd = fs.openSync('/proc/self/fd/' + INTERRUPTS, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
  } catch (e) {
    // no /proc, or fd 5 is not a pipe
  }

  function begin(id, code) {
    count++;
    seq = (seq + 1) & SEQ_MASK;
    const r = { id, n: count, seq, ended: false };
    run = r;
    Atomics.store(st, 0, word(r.seq, RUNNING));
    if (markFd >= 0) {
      try {
        fs.writeSync(markFd, 'S' + r.seq + '.');
      } catch (e) {
        // A full pipe: the worker is far behind; this run cannot be
        // interrupted.
      }
    }
    // execd holds interrupts until it reads this: from now on one counts.
    const w = word(r.seq, RUNNING);
    if (Atomics.compareExchange(st, 0, w, word(r.seq, WRITING)) === w) {
      try {
        writeLine(encode({ type: 'started', id: r.id }));
      } finally {
        if (Atomics.exchange(st, 0, w) === word(r.seq, WRITING_INTERRUPTED)) worker.postMessage(r.seq);
      }
    }
    const name = '<cell-' + r.n + '>';
    if (ts !== null) {
      let out;
      try {
        out = transpile(code, name);
      } catch (e) {
        // The typescript module failed: the run fails, the context goes on.
        out = { error: errorReply(r.id, e) };
      }
      if (out.error) {
        finish(r, RUNNING, { type: 'error', id: r.id, ...out.error });
        return;
      }
      code = out.js;
    }
    const source = (objectLiteral(code) || code) + '\n//# sourceURL=' + name;
    let compiling = true;
    session.post('Runtime.evaluate', { expression: source, replMode: true, objectGroup: group(r) }, (err, res) => {
      // A cell that does not compile is answered during the call; a cell
      // that runs is answered when its completion promise settles.
      evaluated(r, err, res, compiling ? { name, code } : undefined);
    });
    compiling = false;
  }

  function evaluated(r, err, res, sync) {
    if (r !== run || r.ended) {
      // A run that was interrupted while it waited has settled since.
      if (!err && res && res.exceptionDetails) {
        const e = valueOf(r, res.exceptionDetails.exception);
        release(r);
        logStderr('Uncaught (in a run that was interrupted) ' + inspect(e === NONE ? res.exceptionDetails.text : e));
      } else {
        release(r);
      }
      return;
    }
    if (phaseOf(Atomics.load(st, 0)) !== RUNNING) {
      release(r);
      return; // being terminated: the interrupt ends the run
    }
    let msg;
    if (err) {
      release(r);
      msg = { type: 'error', id: r.id, ename: 'Error', evalue: safeString(err.message), traceback: [] };
    } else if (res.exceptionDetails) {
      const d = res.exceptionDetails;
      const e = valueOf(r, d.exception);
      release(r);
      if (e === NONE) {
        const desc = (d.exception && d.exception.description) || d.text || 'Uncaught';
        msg = { type: 'error', id: r.id, ename: 'Error', evalue: desc.split('\n')[0], traceback: desc.split('\n') };
      } else {
        const location = sync && isError(e) && e instanceof SyntaxError ? syntaxLocation(sync.name, sync.code, d) : undefined;
        msg = errorReply(r.id, e, location);
      }
    } else {
      const v = valueOf(r, res.result);
      release(r);
      if (v === NONE) {
        const desc = (res.result && res.result.description) || '';
        msg = { type: 'result', id: r.id, execution_count: r.n, data: { 'text/plain': desc } };
      } else if (v !== undefined) {
        msg = { type: 'result', id: r.id, execution_count: r.n, data: bundle(v) };
      }
    }
    finish(r, RUNNING, msg);
  }

  // finish ends run r, which is in the given phase, with msg (a result or an
  // error, or none) and done. It does nothing when the phase changed
  // meanwhile: an interrupt ends the run.
  function finish(r, phase, msg) {
    let line;
    if (msg) {
      line = encode(msg);
      if (line.length > maxLine / 3 && Buffer.byteLength(line) > maxLine) {
        line = encode(tooLarge(msg));
      }
    }
    const w = word(r.seq, phase);
    if (r.ended || Atomics.compareExchange(st, 0, w, word(r.seq, WRITING)) !== w) return;
    r.ended = true;
    if (line !== undefined) writeLine(line);
    writeLine(encode({ type: 'done', id: r.id, execution_count: r.n }));
    run = null;
    Atomics.store(st, 0, word(r.seq, IDLE));
    // Not setImmediate: an immediate of the driver's queued before one of
    // the code's makes an interrupt of the latter break node (see
    // brokenImmediates).
    process.nextTick(next);
  }

  function tooLarge(msg) {
    const note = 'the ' + msg.type + ' is larger than the ' + (maxLine >> 20) + ' MiB a reply may hold';
    if (msg.type === 'error') return { ...msg, evalue: note, traceback: [] };
    return { ...msg, data: { 'text/plain': note } };
  }

  // interrupted ends run number s, which the worker has terminated.
  function interrupted(s) {
    terminated = true;
    forgetAsyncContexts();
    const r = run;
    if (!r || r.seq !== s || r.ended) return;
    finish(r, TERMINATING, {
      type: 'error',
      id: r.id,
      ename: 'Interrupted',
      evalue: 'execution was interrupted',
      traceback: ['Interrupted: execution was interrupted'],
    });
  }

  // ---- display ------------------------------------------------------------

  // show sends a display message for the run in progress; there is none
  // for code that runs between runs.
  function show(data) {
    const r = run;
    if (!r || r.ended) return;
    const line = encode({ type: 'display', id: r.id, data });
    if (Buffer.byteLength(line) > maxLine) {
      throw new RangeError('display: the output is larger than the ' + (maxLine >> 20) + ' MiB a reply may hold');
    }
    const w = word(r.seq, RUNNING);
    if (Atomics.compareExchange(st, 0, w, word(r.seq, WRITING)) !== w) return;
    try {
      writeLine(line);
    } finally {
      // Back to RUNNING; an interrupt that came during the write terminates
      // the code now.
      if (Atomics.exchange(st, 0, w) === word(r.seq, WRITING_INTERRUPTED)) worker.postMessage(r.seq);
    }
  }

  function text(helper, s) {
    if (typeof s !== 'string') throw new TypeError(helper + ' expects a string, not ' + typeof s);
    return s;
  }

  function base64(helper, d) {
    if (typeof d === 'string') {
      const s = d.replace(/\s+/g, '');
      if (!/^[A-Za-z0-9+/]*={0,2}$/.test(s)) throw new TypeError(helper + ' expects base64 text');
      return s;
    }
    if (ArrayBuffer.isView(d)) return Buffer.from(d.buffer, d.byteOffset, d.byteLength).toString('base64');
    if (d instanceof ArrayBuffer) return Buffer.from(d).toString('base64');
    throw new TypeError(helper + ' expects base64 text or bytes, not ' + typeof d);
  }

  function display(...values) {
    for (const v of values) show(bundle(v));
  }
  const helpers = {
    html: (s) => show({ 'text/html': text('display.html', s) }),
    markdown: (s) => show({ 'text/markdown': text('display.markdown', s) }),
    svg: (s) => show({ 'image/svg+xml': text('display.svg', s) }),
    latex: (s) => show({ 'text/latex': text('display.latex', s) }),
    png: (d) => show({ 'image/png': base64('display.png', d) }),
    jpeg: (d) => show({ 'image/jpeg': base64('display.jpeg', d) }),
    json: (v) => {
      const json = JSON.stringify(v);
      if (json === undefined) throw new TypeError('display.json expects a JSON value, not ' + typeof v);
      show({ 'application/json': new Raw(json) });
    },
  };
  for (const [name, fn] of Object.entries(helpers)) {
    Object.defineProperty(fn, 'name', { value: name });
    Object.defineProperty(display, name, { value: fn, writable: true, configurable: true, enumerable: true });
  }

  // ---- the context's globals ----------------------------------------------

  const cwd = process.cwd();
  const replFile = path.join(cwd, '<repl>');
  const userModule = new Module(replFile, null);
  userModule.filename = replFile;
  userModule.paths = Module._nodeModulePaths(cwd);
  userModule.loaded = true;
  const userRequire = Module.createRequire(replFile);
  for (const [name, value] of [
    ['display', display],
    ['require', userRequire],
    ['module', userModule],
  ]) {
    Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
  }
  process.argv.splice(1);

  // ---- typescript ---------------------------------------------------------

  // ts is the typescript module in a typescript context, else null.
  const ts = language === 'typescript' ? loadTypeScript() : null;
  if (ts !== null) {
    // What a cell that exports something writes to.
    Object.defineProperty(globalThis, 'exports', { value: userModule.exports, writable: true, configurable: true, enumerable: false });
  }

  // loadTypeScript returns the typescript module: the one the working
  // directory's node_modules offer, else a system-wide one (Debian's
  // node-typescript, npm's global modules). Without one the driver exits.
  function loadTypeScript() {
    const tries = [
      () => userRequire('typescript'),
      () => require('typescript'),
      () => require('/usr/share/nodejs/typescript'),
      () => require('/usr/lib/nodejs/typescript'),
      () => require('/usr/local/lib/node_modules/typescript'),
      () => require('/usr/lib/node_modules/typescript'),
    ];
    for (const t of tries) {
      try {
        const m = t();
        if (m && typeof m.transpileModule === 'function') return m;
      } catch (e) {
        // not there: the next place
      }
    }
    logStderr('the typescript module is not installed (Debian: node-typescript; npm: typescript)');
    process.exit(1);
  }

  // importToRequire returns the statement that stands for an import
  // declaration in a cell: a const bound to what require() returns, so
  // that the names it binds are the names later cells use (the CommonJS
  // transform would rename them, path to path_1.default). Type-only
  // imports vanish.
  function importToRequire(decl, sf) {
    const spec = decl.moduleSpecifier.getText(sf);
    const clause = decl.importClause;
    if (!clause) return 'require(' + spec + ');';
    if (clause.isTypeOnly) return '';
    const out = [];
    const mod = 'require(' + spec + ')';
    if (clause.name) {
      out.push('const ' + clause.name.text + ' = ((m) => (m && m.__esModule ? m.default : m))(' + mod + ');');
    }
    const nb = clause.namedBindings;
    if (nb && ts.isNamespaceImport(nb)) {
      out.push('const ' + nb.name.text + ' = ' + mod + ';');
    } else if (nb) {
      const names = nb.elements
        .filter((e) => !e.isTypeOnly)
        .map((e) => (e.propertyName ? e.propertyName.text + ': ' + e.name.text : e.name.text));
      if (names.length > 0) out.push('const { ' + names.join(', ') + ' } = ' + mod + ';');
    }
    return out.join(' ');
  }

  // transpile turns a typescript cell into javascript with the types
  // erased: { js }, or { error } (the fields of an error reply) when the
  // cell does not parse. Types are not checked. Import declarations become
  // require() calls on the line they were on, so that line numbers stay.
  function transpile(code, name) {
    const sf = ts.createSourceFile(name + '.ts', code, ts.ScriptTarget.ES2022, true);
    let src = code;
    const imports = sf.statements.filter((st) => ts.isImportDeclaration(st));
    for (let i = imports.length - 1; i >= 0; i--) {
      const d = imports[i];
      const start = d.getStart(sf);
      const lines = code.slice(start, d.end).split('\n').length - 1;
      src = src.slice(0, start) + importToRequire(d, sf) + '\n'.repeat(lines) + src.slice(d.end);
    }
    const literal = objectLiteral(src);
    if (literal !== undefined) src = literal;
    const out = ts.transpileModule(src, {
      fileName: name + '.ts',
      reportDiagnostics: true,
      compilerOptions: {
        target: ts.ScriptTarget.ES2022,
        module: ts.ModuleKind.CommonJS,
        esModuleInterop: true,
        removeComments: false,
      },
    });
    const diags = (out.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error);
    if (diags.length > 0) {
      const d = diags[0];
      const msg = ts.flattenDiagnosticMessageText(d.messageText, '\n');
      let traceback = [];
      if (d.file && typeof d.start === 'number') {
        const pos = d.file.getLineAndCharacterOfPosition(d.start);
        const line = d.file.text.split('\n')[pos.line] || '';
        traceback = [name + ':' + (pos.line + 1), line, ' '.repeat(Math.min(pos.character, line.length)) + '^', ''];
      }
      traceback.push('SyntaxError: ' + msg + ' (TS' + d.code + ')');
      return { error: { ename: 'SyntaxError', evalue: msg, traceback } };
    }
    // A cell that exports is a module for the transform, which then
    // makes it strict; cells are sloppy, as in javascript.
    return { js: out.outputText.replace(/^"use strict";\n/, '') };
  }

  // ---- process ------------------------------------------------------------

  // A termination skips the JavaScript half of node's bookkeeping of async
  // contexts: code stopped in a timer, an immediate or a nextTick callback
  // leaves the context it entered on node's stack, and node aborts the
  // process when it finds its stack so (what --no-force-async-hooks-checks
  // turns off). The driver turns the check off, and empties the stack after
  // every termination as node does after an uncaught exception. Code that
  // enables async_hooks turns the check back on for as long as its hooks
  // are enabled.
  let asyncWrap = null;
  try {
    const quiet = process.noDeprecation;
    process.noDeprecation = true;
    try {
      asyncWrap = process.binding('async_wrap');
    } finally {
      process.noDeprecation = quiet;
    }
    asyncWrap.async_hook_fields[asyncWrap.constants.kCheck] = 0;
  } catch (e) {
    asyncWrap = null;
  }

  let terminated = false; // a run has been interrupted

  // brokenImmediates reports whether e is node failing to run immediates:
  // node keeps its place in the list of immediates it runs in a finally
  // block, which a termination skips; when the stopped callback was not the
  // first of its list, node then fails on every turn of its event loop.
  function brokenImmediates(e) {
    // The failure loops in node before the main thread hears of the
    // termination: the shared word tells it.
    const stopped = terminated || phaseOf(Atomics.load(st, 0)) === TERMINATING;
    if (!stopped || !(e instanceof TypeError) || typeof e.stack !== 'string') return false;
    const frame = e.stack.split('\n')[1] || '';
    return /\bprocessImmediate \(node:internal\/timers[:)]/.test(frame);
  }

  function forgetAsyncContexts() {
    if (asyncWrap === null) return;
    try {
      asyncWrap.clearAsyncIdStack();
    } catch (e) {
      // a node without it: nothing to forget
    }
  }

  function logStderr(text) {
    try {
      process.stderr.write(text + '\n');
    } catch (e) {
      // stderr is gone
    }
  }

  // The code's output: process.stdout and process.stderr write each chunk
  // at once, with a plain loop of synchronous writes, so that it is in the
  // pipes when done is written (on a pipe node writes asynchronously), and
  // so that an interrupt cannot stop a stream in the middle of its write (it
  // would stay "writing" and keep all later output to itself). A closed pipe
  // does not kill the context: the output is dropped.
  for (const [fd, s] of [
    [1, process.stdout],
    [2, process.stderr],
  ]) {
    if (s._handle && typeof s._handle.setBlocking === 'function') s._handle.setBlocking(true);
    s.on('error', () => {});
    s.write = function write(chunk, encoding, cb) {
      if (typeof encoding === 'function') {
        cb = encoding;
        encoding = undefined;
      }
      let b;
      if (typeof chunk === 'string') {
        b = Buffer.from(chunk, Buffer.isEncoding(encoding) ? encoding : 'utf8');
      } else if (ArrayBuffer.isView(chunk)) {
        b = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      } else {
        throw new TypeError('The "chunk" argument must be of type string or an instance of Buffer or Uint8Array');
      }
      writeAll(fd, b);
      if (typeof cb === 'function') process.nextTick(cb, null);
      return true;
    };
  }
  // Errors of code still running after its run ended go to stderr.
  process.on('uncaughtException', (e) => {
    if (brokenImmediates(e)) {
      logStderr('execd javascript driver: an interrupt stopped the code in a setImmediate callback and left node unable to run immediates; the context cannot go on');
      process.exit(1);
    }
    logStderr('Uncaught ' + inspect(e));
  });
  process.on('unhandledRejection', (e) => logStderr('Uncaught (in promise) ' + inspect(e)));
  process.on('SIGINT', () => {}); // execd interrupts through fd 5

  // The interrupt worker.
  const phases = { IDLE, RUNNING, WRITING, WRITING_INTERRUPTED, TERMINATING };
  const worker = new Worker('(' + interrupter.toString() + ')(require("worker_threads").workerData)', {
    eval: true,
    workerData: { shared: st.buffer, fd: INTERRUPTS, marked: markFd >= 0, phases },
    stdout: false,
    stderr: false,
  });
  worker.unref();
  worker.on('message', interrupted);
  worker.on('error', (e) => logStderr('execd javascript driver: the interrupt thread failed: ' + inspect(e)));

  // ---- requests -----------------------------------------------------------

  function next() {
    if (run !== null || queue.length === 0) return;
    const msg = queue.shift();
    begin(safeString(msg.id), typeof msg.code === 'string' ? msg.code : '');
  }

  function request(line) {
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (e) {
      return;
    }
    if (msg === null || typeof msg !== 'object' || msg.type !== 'execute') return;
    queue.push(msg);
    next();
  }

  // Lines of requests, split as they come; chunks hold a line's start.
  let chunks = [];
  const requests = new net.Socket({ fd: REQUESTS, readable: true, writable: false });
  requests.setEncoding('utf8');
  requests.on('data', (chunk) => {
    let i;
    while ((i = chunk.indexOf('\n')) >= 0) {
      chunks.push(chunk.slice(0, i));
      const line = chunks.join('');
      chunks = [];
      chunk = chunk.slice(i + 1);
      request(line);
    }
    if (chunk !== '') chunks.push(chunk);
  });
  // execd closed the requests pipe: exit.
  requests.on('end', () => process.exit(0));
  requests.on('error', () => process.exit(0));

  writeLine(encode({ type: 'ready', language, version: ts !== null ? ts.version : process.versions.node }));
}

main();
