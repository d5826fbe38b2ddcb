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
        const open = Array.prototype.map.call(section.querySelectorAll("table.trials details[open]"), function (d) {
          return d.closest("tr").cells[0].dataset.v;
        });
        swapParts(section, data.shapes[taskId].parts);
        open.forEach(function (n) {
          const cell = section.querySelector('table.trials td[data-v="' + n + '"]:first-child');
          const details = cell && cell.parentElement.querySelector("details");
          if (details) details.open = true;
        });
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
        best.textContent = job.tasks === 1 ? fmtMs(job.best_ms)
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
          shapes: job.tasks.map(function (t) { return { best_ms: t.best_ms }; }) });
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

  // -- a job page's table of every trial: filter and sort in the page --------------------------
  // The view (filter, outcome, sorted column) lives on the controls, outside the table, so a live
  // refresh that replaces the table keeps it: trialView applies it again.
  function matches(tokens, term) {
    return tokens.some(function (tok) { return tok === term || (term.indexOf("=") < 0 && tok.indexOf(term) >= 0); });
  }

  function sortValue(cell, kind) {
    if (kind === "num") {
      const v = cell.dataset.v;
      return v === undefined || v === "" ? null : Number(v);
    }
    return cell.textContent.trim().toLowerCase();
  }

  function trialView(section) {
    const form = section && section.querySelector("[data-controls]");
    const table = section && section.querySelector("table.trials");
    if (!form || !table) return;
    const body = table.tBodies[0];
    const rows = Array.prototype.slice.call(body.querySelectorAll("tr[data-outcome]"));
    const col = form.dataset.sortCol;
    const heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th) { th.removeAttribute("aria-sort"); });
    if (col !== undefined && heads[col]) {
      const kind = heads[col].dataset.sort, dir = form.dataset.sortDir === "desc" ? -1 : 1;
      rows.sort(function (a, b) {
        const x = sortValue(a.cells[col], kind), y = sortValue(b.cells[col], kind);
        if (x === null || y === null) return (x === null) - (y === null);  // blanks last
        return x < y ? -dir : x > y ? dir : 0;
      });
      rows.forEach(function (r) { body.appendChild(r); });
      heads[col].setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
    }
    const terms = form.elements.q.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const outcome = form.elements.outcome.value;
    let shown = 0;
    rows.forEach(function (r) {
      const tokens = r.dataset.search.toLowerCase().split(/\s+/);
      const ok = (!outcome || r.dataset.outcome === outcome)
        && terms.every(function (t) { return matches(tokens, t); });
      r.hidden = !ok;
      if (ok) shown += 1;
    });
    const out = form.querySelector('[data-field="shown"]');
    if (out) out.textContent = shown === rows.length ? rows.length + " trials" : shown + " of " + rows.length + " trials shown";
  }

  function sortBy(th) {
    const section = th.closest("section.shape");
    const form = section && section.querySelector("[data-controls]");
    if (!form) return;
    const col = String(th.cellIndex);
    form.dataset.sortDir = form.dataset.sortCol === col && form.dataset.sortDir !== "desc" ? "desc" : "asc";
    form.dataset.sortCol = col;
    trialView(section);
  }

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
    if (th) sortBy(th);
  });
  ["input", "change"].forEach(function (type) {
    document.addEventListener(type, function (ev) {
      const form = ev.target.closest && ev.target.closest("[data-controls]");
      if (form) trialView(form.closest("section.shape"));
    });
  });
  listen();
  filterConfigs();
  tick();
  window.setInterval(tick, 1000);
})();
