// The console's one script: the inbox's live rows (Server-Sent Events) and the countdowns.
// It builds every node with createElement and textContent: nothing it receives is parsed as HTML.
"use strict";

(function () {
  function duration(seconds) {
    if (seconds < 90) { return Math.round(seconds) + " s"; }
    if (seconds < 90 * 60) { return Math.round(seconds / 60) + " min"; }
    return (seconds / 3600).toFixed(1) + " h";
  }

  function until(at) {
    var left = at - Date.now() / 1000;
    return left <= 0 ? "expired" : duration(left);
  }

  function cell(row, text, className) {
    var td = document.createElement("td");
    if (className) { td.className = className; }
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function link(href, text, className) {
    var a = document.createElement("a");
    a.href = href;
    a.textContent = text;
    if (className) { a.className = className; }
    return a;
  }

  function addRow(body, a) {
    if (body.querySelector('tr[data-approval="' + CSS.escape(a.approval_id) + '"]')) { return; }
    var row = document.createElement("tr");
    row.dataset.approval = a.approval_id;
    row.dataset.created = String(a.created_at);
    row.dataset.expires = String(a.expires_at);
    var tool = cell(row, a.tool);
    if (a.reconcile) {
      var tag = document.createElement("span");
      tag.className = "tag";
      tag.textContent = "reconcile";
      tool.appendChild(document.createTextNode(" "));
      tool.appendChild(tag);
    }
    cell(row, "").appendChild(link("/runs/" + encodeURIComponent(a.run_id), a.run_id));
    cell(row, a.tenant);
    cell(row, a.proposer || "\u2014");
    var code = document.createElement("code");
    code.textContent = a.policy_rule || "\u2014";
    cell(row, "").appendChild(code);
    cell(row, duration(Math.max(0, Date.now() / 1000 - a.created_at)), "age");
    cell(row, until(a.expires_at), "expires");
    cell(row, "").appendChild(link("/approvals/" + encodeURIComponent(a.approval_id),
                                   "Review " + a.approval_id, "open"));
    body.appendChild(row);
  }

  function refreshEmpty(body) {
    var empty = document.getElementById("inbox-empty");
    if (empty) { empty.hidden = body.rows.length > 0; }
  }

  function live(table) {
    var body = document.getElementById("inbox-rows");
    var state = document.getElementById("live-state");
    var source = new EventSource(table.dataset.live);
    source.addEventListener("open", function () { state.textContent = "live."; });
    source.addEventListener("error", function () { state.textContent = "reconnecting…"; });
    source.addEventListener("approval", function (e) {
      addRow(body, JSON.parse(e.data));
      refreshEmpty(body);
    });
    source.addEventListener("pending", function (e) {
      var pending = new Set(JSON.parse(e.data));
      Array.prototype.slice.call(body.rows).forEach(function (row) {
        if (!pending.has(row.dataset.approval)) { row.remove(); }
      });
      refreshEmpty(body);
    });
    source.addEventListener("problem", function (e) {
      state.textContent = "stopped (" + JSON.parse(e.data) + "): reload the page to follow again.";
      source.close();
    });
  }

  function tick() {
    var now = Date.now() / 1000;
    document.querySelectorAll("tr[data-expires]").forEach(function (row) {
      var age = row.querySelector(".age");
      var expires = row.querySelector(".expires");
      if (age) { age.textContent = duration(Math.max(0, now - Number(row.dataset.created))); }
      if (expires) { expires.textContent = until(Number(row.dataset.expires)); }
    });
    document.querySelectorAll(".countdown[data-expires]").forEach(function (span) {
      span.textContent = until(Number(span.dataset.expires));
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var table = document.getElementById("inbox");
    if (table && table.dataset.live && window.EventSource) { live(table); }
    window.setInterval(tick, 1000);
  });
})();
