// triton-tuner dashboard: live progress (server-sent events), cancel, copy buttons, client-side
// filtering. Everything here is an enhancement: the pages work without it.
(function () {
  "use strict";
  const ACTIVE = ["queued", "running"];
  const fmtMs = (ms) => (ms === null || ms === undefined) ? "-" : (ms < 10 ? ms.toFixed(4) : ms.toFixed(1));

  function setStatus(el, status) {
    el.textContent = status;
    el.className = "status " + status;
  }

  let redrawAt = 0, redrawn = -1;
  function redraw(job) {
    // on a running job's page, redraw the charts as trials arrive (at most every 2 s)
    if (!window.tunerRedraw || !document.querySelector('[data-live-job][data-job="' + job.id + '"]')) return;
    const now = Date.now();
    if (job.trials_done === redrawn || now - redrawAt < 2000) return;
    redrawAt = now;
    redrawn = job.trials_done;
    window.tunerRedraw(job.id);
  }

  function update(job) {
    redraw(job);
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
        row.querySelectorAll("[data-cancel]").forEach(function (b) { b.remove(); });
      }
      if (row.hasAttribute("data-live-job") && ACTIVE.indexOf(was) >= 0 && ACTIVE.indexOf(job.status) < 0) {
        // the job page: draw the final charts and tables
        window.setTimeout(function () { window.location.reload(); }, 300);
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

  function cancel(button) {
    const id = button.dataset.cancel;
    const form = button.closest("form");
    const input = form ? form.querySelector('input[name="api_key"]') : null;
    let key = (input && input.value) || window.localStorage.getItem("tuner_write_key") || "";
    const message = document.getElementById("cancel-message");
    const headers = key ? { "X-API-Key": key } : {};
    fetch("/api/v1/jobs/" + id + "/cancel", { method: "POST", headers: headers }).then(function (r) {
      if (r.status === 401 || r.status === 403) {
        const typed = window.prompt("Cancelling needs an API key with write access:");
        if (typed) { window.localStorage.setItem("tuner_write_key", typed); cancel(button); return; }
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

  document.addEventListener("click", function (ev) {
    const c = ev.target.closest("[data-cancel]");
    if (c) { ev.preventDefault(); cancel(c); return; }
    const b = ev.target.closest("[data-copy]");
    if (b) { ev.preventDefault(); copy(b); }
  });
  listen();
  filterConfigs();
})();
