// triton-tuner dashboard: live progress (server-sent events), a running job's page kept current,
// cancel (confirmed first), copy buttons, client-side filtering and sorting, relative times that
// count on. Everything here is an enhancement: the pages work without it.
(function () {
  "use strict";
  const ACTIVE = ["queued", "running"];
  const fmtMs = (ms) => (ms === null || ms === undefined) ? "-" : (ms < 10 ? ms.toFixed(4) : ms.toFixed(1));

  function setStatus(el, status) {
    el.textContent = status;
    el.className = "status " + status;
  }

  // -- a running job's page: every number on it follows the trials ----------------------------
  // Whenever the job's progress changes, the page fetches /jobs/{id}/live (its parts rendered
  // again by the server's templates, and the chart data) and swaps them in: one refresh at a
  // time, spaced by at least three times what the last one took, and always one more after the
  // last change, so the page ends on the job's final numbers without a reload.
  const live = { busy: false, pending: false, last: null, at: 0, cost: 0, timer: null };

  function followJob(job) {
    if (!document.querySelector('[data-live-job][data-job="' + job.id + '"]')) return;
    const key = JSON.stringify([job.status, job.trials_done, job.shapes]);
    if (key === live.last) return;
    live.last = key;
    scheduleRefresh(job.id);
  }

  function scheduleRefresh(id) {
    if (live.busy) { live.pending = true; return; }
    const wait = Math.max(500, 3 * live.cost) - (Date.now() - live.at);
    if (wait > 0) {
      if (!live.timer) live.timer = window.setTimeout(function () { live.timer = null; refreshJob(id); }, wait);
      return;
    }
    refreshJob(id);
  }

  function swapParts(scope, parts) {
    Object.keys(parts).forEach(function (name) {
      const el = scope.querySelector('[data-live="' + name + '"]');
      if (el) el.innerHTML = parts[name];
    });
  }

  function refreshJob(id) {
    live.busy = true;
    live.pending = false;
    const started = Date.now();
    return fetch("/jobs/" + id + "/live").then(function (r) {
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.json();
    }).then(function (data) {
      swapParts(document, data.parts);
      Object.keys(data.shapes).forEach(function (taskId) {
        const section = document.querySelector('section.shape[data-task="' + taskId + '"]');
        if (!section) return;
        swapParts(section, data.shapes[taskId].parts);
        tableData[taskId] = data.shapes[taskId].data;
        trialView(section);
        const box = section.querySelector("[data-charts]");
        if (box && window.tunerDraw) window.tunerDraw(box, data.shapes[taskId].data);
      });
      tick();
      document.body.dataset.refreshes = String((Number(document.body.dataset.refreshes) || 0) + 1);
    }).catch(function (err) {
      const message = document.getElementById("cancel-message");
      if (message) message.textContent = "Could not refresh the page's numbers: " + err.message;
    }).finally(function () {
      live.busy = false;
      live.at = Date.now();
      live.cost = live.at - started;
      if (live.pending) scheduleRefresh(id);
    });
  }

  function update(job) {
    followJob(job);
    document.querySelectorAll('[data-job="' + job.id + '"]').forEach(function (row) {
      const was = row.dataset.status;
      row.dataset.status = job.status;
      row.querySelectorAll('[data-field="status"]').forEach(function (el) { setStatus(el, job.status); });
      const bar = row.querySelector('[data-field="bar"]');
      if (bar) { bar.max = job.budget; bar.value = Math.min(job.trials_done, job.budget); }
      const trials = row.querySelector('[data-field="trials"]');
      if (trials) trials.textContent = job.trials_done + " / " + job.budget;
      const best = row.querySelector('[data-field="best"]');
      if (best) {
        best.textContent = job.tasks === 1
          ? fmtMs(job.best_ms) + (job.best_ms !== null && job.shapes[0].best_measured === "trial" ? " (trial)" : "")
          : job.shapes.filter(function (s) { return s.best_ms !== null; }).length + " of " + job.tasks + " shapes";
      }
      if (ACTIVE.indexOf(job.status) < 0) {
        row.querySelectorAll(".cancel-form, [data-cancel]").forEach(function (b) { b.remove(); });
      }
    });
    const jobStatus = document.getElementById("job-status");
    if (jobStatus && document.querySelector('[data-live-job][data-job="' + job.id + '"]')) setStatus(jobStatus, job.status);
  }

  function listen() {
    if (!window.EventSource) return;
    const rows = Array.prototype.slice.call(document.querySelectorAll("[data-job]"));
    const ids = Array.from(new Set(rows.filter(function (r) { return ACTIVE.indexOf(r.dataset.status) >= 0; })
      .map(function (r) { return r.dataset.job; })));
    const listPage = document.querySelector("table[data-live-jobs]") && window.location.pathname === "/jobs";
    if (!ids.length && !listPage) return;
    const url = "/events/jobs?ids=" + encodeURIComponent(ids.join(",")) + (listPage ? "&active=1" : "");
    const source = new EventSource(url);
    const state = document.getElementById("live-state");
    if (state) state.textContent = "live";
    source.addEventListener("progress", function (ev) {
      const data = JSON.parse(ev.data);
      let unseen = 0;
      data.jobs.forEach(function (job) {
        if (!document.querySelector('[data-job="' + job.id + '"]')) unseen += 1;
        update(job);
      });
      if (state) {
        state.textContent = unseen ? "live · " + unseen + " new job" + (unseen > 1 ? "s" : "") + " (reload to see)" : "live";
      }
    });
    source.addEventListener("end", function () {
      source.close();
      if (state) state.textContent = "";
    });
    source.onerror = function () { if (state) state.textContent = "reconnecting…"; };
  }

  function cancel(button, confirmed) {
    const id = button.dataset.cancel;
    const message = document.getElementById("cancel-message");
    if (!confirmed && !window.confirm("Cancel job " + id.slice(0, 8) + "? Its search stops and cannot be resumed; "
        + "shapes already finished keep their results.")) {
      if (message) message.textContent = "Not cancelled.";
      return;
    }
    const form = button.closest("form");
    const input = form ? form.querySelector('input[name="api_key"]') : null;
    let key = (input && input.value) || window.localStorage.getItem("tuner_write_key") || "";
    const headers = key ? { "X-API-Key": key } : {};
    fetch("/api/v1/jobs/" + id + "/cancel", { method: "POST", headers: headers }).then(function (r) {
      if (r.status === 401 || r.status === 403) {
        const typed = window.prompt("Cancelling needs an API key with write access:");
        if (typed) { window.localStorage.setItem("tuner_write_key", typed); cancel(button, true); return; }
        if (message) message.textContent = "Not cancelled: a write API key is needed.";
        return;
      }
      return r.json().then(function (job) {
        if (!r.ok) { if (message) message.textContent = "Not cancelled: " + (job.detail || r.status); return; }
        if (key) window.localStorage.setItem("tuner_write_key", key);
        if (message) message.textContent = "Job " + id.slice(0, 8) + " " + job.status + ".";
        update({ id: job.id, status: job.status, trials_done: job.tasks.reduce(function (a, t) { return a + t.trials_done; }, 0),
          budget: job.budget_trials * job.tasks.length, tasks: job.tasks.length,
          best_ms: job.tasks.length === 1 ? job.tasks[0].best_ms : null,
          shapes: job.tasks.map(function (t) { return { best_ms: t.best_ms, best_measured: t.best_measured }; }) });
      });
    }).catch(function (err) { if (message) message.textContent = "Not cancelled: " + err; });
  }

  function copy(button) {
    const row = button.closest("tr");
    const pre = row && row.querySelector('pre[data-format="' + button.dataset.copy + '"]');
    if (!pre) return;
    const text = pre.textContent;
    const done = function () {
      const out = document.getElementById("copied");
      if (out) { out.textContent = "Copied: " + text; out.dataset.text = text; }
      button.classList.add("done");
      window.setTimeout(function () { button.classList.remove("done"); }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallbackCopy(text); done(); });
    } else { fallbackCopy(text); done(); }
  }

  function fallbackCopy(text) {
    const area = document.createElement("textarea");
    area.value = text;
    document.body.appendChild(area);
    area.select();
    try { document.execCommand("copy"); } catch (e) { /* the text is shown on the page */ }
    area.remove();
  }

  function filterConfigs() {
    const form = document.getElementById("config-filter");
    const table = document.getElementById("configs-table");
    if (!form || !table) return;
    const apply = function () {
      const want = {
        kernel: form.elements.kernel.value, device: form.elements.device.value,
        dtype: form.elements.dtype.value,
        shape: form.elements.shape.value.trim().toLowerCase().replace(/\s+/g, ""),
      };
      let shown = 0;
      const rows = table.querySelectorAll("tbody tr[data-kernel]");
      rows.forEach(function (row) {
        const ok = (!want.kernel || row.dataset.kernel === want.kernel)
          && (!want.device || row.dataset.device === want.device)
          && (!want.dtype || row.dataset.dtype === want.dtype)
          && (!want.shape || row.dataset.shape.toLowerCase().indexOf(want.shape) >= 0);
        row.hidden = !ok;
        if (ok) shown += 1;
      });
      const count = document.getElementById("config-count");
      if (count) count.textContent = shown + " shown";
      const params = new URLSearchParams();
      Object.keys(want).forEach(function (k) { if (want[k]) params.set(k, form.elements[k].value); });
      window.history.replaceState(null, "", "/configs" + (params.toString() ? "?" + params : ""));
    };
    form.addEventListener("input", apply);
    form.addEventListener("change", apply);
  }

  // -- a job page's table of every trial: filter, sort and page through it in the page ----------
  // Drawn from the shape's data (every trial, as compact arrays), a page of rows at a time, so a
  // shape of thousands of trials stays quick; the server's HTML holds the first rows for
  // browsers without JavaScript. The view (filter, outcome, sorted column, page) lives on the
  // controls, outside the table, so a live refresh keeps it.
  const PAGE_ROWS = 100;
  const tableData = {};

  function fixed(v, digits) { return v === null || v === undefined || !isFinite(v) ? "-" : v.toFixed(digits); }

  function columns(d) {
    const t = d.table;
    const rate = function (work, scale) {
      return function (i) { const ms = t.ms[i]; return work && ms ? work / (ms * 1e-3) / scale : null; };
    };
    const cols = [
      { kind: "num", value: function (i) { return d.numbers[i]; } },
      { kind: "text", value: function (i) { return t.outcome[i]; },
        cell: function (td, i) { const s = document.createElement("span"); s.className = "outcome " + t.outcome[i]; s.textContent = t.outcome[i]; td.appendChild(s); } },
    ];
    d.names.forEach(function (name, j) {
      cols.push({ kind: "num", value: function (i) { const v = d.configs[i][j]; return v === undefined ? null : v; } });
    });
    cols.push({ kind: "num", value: function (i) { return t.ms[i]; }, field: "ms",
      cell: function (td, i) {
        td.appendChild(document.createTextNode(fmtMs(t.ms[i])));
        if (t.ms[i] === null) return;
        const s = document.createElement("span");
        s.className = t.retimed[i] ? "tag" : "muted small";
        s.textContent = t.retimed[i] ? "re-timed" : "trial";
        td.appendChild(document.createTextNode(" "));
        td.appendChild(s);
      } });
    cols.push({ kind: "num", value: function (i) { return t.retimed[i] ? t.trial_p50[i] : t.ms[i]; }, text: fmtMs });
    cols.push({ kind: "num", value: rate(t.flops, 1e12), text: function (v) { return fixed(v, 2); } });
    cols.push({ kind: "num", value: rate(t.bytes, 1e9), text: function (v) { return fixed(v, 1); } });
    cols.push({ kind: "num", value: function (i) { return t.compile[i]; }, text: function (v) { return fixed(v, 2); } });
    cols.push({ kind: "text", value: function (i) { return t.gpus[t.gpu[i]]; }, className: "gpu" });
    cols.push({ kind: "text", value: function (i) { return d.errors[i] || ""; }, className: "reason" });
    return cols;
  }

  function matches(tokens, term) {
    return tokens.some(function (tok) { return tok === term || (term.indexOf("=") < 0 && tok.indexOf(term) >= 0); });
  }

  function trialView(section) {
    const form = section && section.querySelector("[data-controls]");
    const table = section && section.querySelector("table.trials");
    const d = section && tableData[section.dataset.task];
    if (!form || !table || !d || !d.table) return;
    const cols = columns(d), t = d.table, n = d.numbers.length;
    const terms = form.elements.q.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const outcome = form.elements.outcome.value;
    let rows = [];
    for (let i = 0; i < n; i++) {
      if (outcome && t.outcome[i] !== outcome) continue;
      if (terms.length) {
        const tokens = [String(d.numbers[i]), t.outcome[i]].concat(
          d.names.map(function (name, j) { return (name + "=" + d.configs[i][j]).toLowerCase(); }),
          (d.errors[i] || "").toLowerCase().split(/\s+/));
        if (!terms.every(function (term) { return matches(tokens, term); })) continue;
      }
      rows.push(i);
    }
    const heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th) { th.removeAttribute("aria-sort"); });
    const col = form.dataset.sortCol;
    if (col !== undefined && cols[col]) {
      const value = cols[col].value, dir = form.dataset.sortDir === "desc" ? -1 : 1;
      const text = cols[col].kind === "text";
      rows.sort(function (a, b) {
        let x = value(a), y = value(b);
        if (x === null || x === undefined || x === "") x = null;
        if (y === null || y === undefined || y === "") y = null;
        if (x === null || y === null) return (x === null) - (y === null) || a - b;  // blanks last
        if (text) { x = String(x).toLowerCase(); y = String(y).toLowerCase(); }
        return x < y ? -dir : x > y ? dir : a - b;
      });
      heads[col].setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    }
    const pages = Math.max(1, Math.ceil(rows.length / PAGE_ROWS));
    const page = Math.min(Math.max(0, Number(form.dataset.page) || 0), pages - 1);
    form.dataset.page = String(page);
    const best = {};
    t.best.forEach(function (i) { best[i] = true; });
    const body = document.createElement("tbody");
    rows.slice(page * PAGE_ROWS, (page + 1) * PAGE_ROWS).forEach(function (i) {
      const tr = document.createElement("tr");
      tr.dataset.outcome = t.outcome[i];
      if (best[i]) tr.className = "best";
      cols.forEach(function (c) {
        const td = document.createElement("td");
        const v = c.value(i);
        if (c.kind === "num") td.dataset.v = v === null || v === undefined ? "" : String(v);
        if (c.field) td.dataset.field = c.field;
        if (c.className) td.className = c.className;
        if (c.cell) c.cell(td, i);
        else td.textContent = c.text ? c.text(v) : (v === null || v === undefined ? "-" : String(v));
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    if (!rows.length) {
      const tr = document.createElement("tr"), td = document.createElement("td");
      tr.className = "none";
      td.colSpan = cols.length;
      td.className = "empty";
      td.textContent = n ? "no trial matches" : "no trial yet";
      tr.appendChild(td);
      body.appendChild(tr);
    }
    table.replaceChild(body, table.tBodies[0]);
    let shown = rows.length === n ? n + " trials" : rows.length + " of " + n + " trials shown";
    if (pages > 1) shown += " (rows " + (page * PAGE_ROWS + 1) + "-" + Math.min(rows.length, (page + 1) * PAGE_ROWS) + ")";
    const out = form.querySelector('[data-field="shown"]');
    if (out) out.textContent = shown;
    const pager = form.querySelector("[data-pager]");
    if (pager) {
      pager.hidden = pages < 2;
      pager.querySelector('[data-page="-1"]').disabled = page === 0;
      pager.querySelector('[data-page="1"]').disabled = page >= pages - 1;
    }
  }

  function sortBy(th) {
    const section = th.closest("section.shape");
    const form = section && section.querySelector("[data-controls]");
    if (!form) return;
    const col = String(th.cellIndex);
    form.dataset.sortDir = form.dataset.sortCol === col && form.dataset.sortDir !== "desc" ? "desc" : "asc";
    form.dataset.sortCol = col;
    form.dataset.page = "0";
    trialView(section);
  }

  function turnPage(button) {
    const section = button.closest("section.shape");
    const form = section.querySelector("[data-controls]");
    form.dataset.page = String((Number(form.dataset.page) || 0) + Number(button.dataset.page));
    trialView(section);
  }

  document.querySelectorAll("section.shape[data-task]").forEach(function (section) {
    const script = document.getElementById("chart-data-" + section.dataset.task);
    if (!script) return;
    tableData[section.dataset.task] = JSON.parse(script.textContent);
    trialView(section);
  });

  // -- relative times ("3 s ago") count on, from the server's clock -------------------------------
  const serverNow = Date.parse(document.body.dataset.serverNow || "");
  const skew = isNaN(serverNow) ? 0 : serverNow - Date.now();

  function agoText(seconds) {
    const units = [["d", 86400], ["h", 3600], ["min", 60]];
    for (let i = 0; i < units.length; i++) {
      if (seconds >= units[i][1]) return Math.round(seconds / units[i][1]) + " " + units[i][0] + " ago";
    }
    return Math.round(seconds) + " s ago";
  }

  function tick() {
    const now = Date.now() + skew;
    document.querySelectorAll("time[data-ago]").forEach(function (el) {
      const at = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(at)) el.textContent = agoText(Math.max(0, (now - at) / 1000));
    });
  }

  document.addEventListener("click", function (ev) {
    const c = ev.target.closest("[data-cancel]");
    if (c) { ev.preventDefault(); cancel(c); return; }
    const b = ev.target.closest("[data-copy]");
    if (b) { ev.preventDefault(); copy(b); return; }
    const th = ev.target.closest("table.trials th[data-sort]");
    if (th) { sortBy(th); return; }
    const turn = ev.target.closest("[data-pager] [data-page]");
    if (turn) turnPage(turn);
  });
  ["input", "change"].forEach(function (type) {
    document.addEventListener(type, function (ev) {
      const form = ev.target.closest && ev.target.closest("[data-controls]");
      if (form) { form.dataset.page = "0"; trialView(form.closest("section.shape")); }
    });
  });
  listen();
  filterConfigs();
  tick();
  window.setInterval(tick, 1000);
})();
