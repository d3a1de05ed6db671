/* tasknet web UI: plain JavaScript, no build step, no network beyond the site.
 *
 * State lives in `state`; the DOM is updated per task row so a WebSocket push
 * changes one row without reloading the list.  Every piece of server data is
 * written with textContent (never innerHTML), so a task name cannot inject
 * markup.
 */
(function () {
  "use strict";

  var LABELS = window.TASKNET_STATUS_LABELS;
  var TOKEN_KEY = "tasknet.token";
  var LANG_KEY = "tasknet.lang";
  var PAGE_SIZE = 50;

  var STRINGS = {
    zh: {
      skip: "跳到内容", signOut: "退出", navTasks: "任务", navAdmin: "管理",
      signInTitle: "登录", tokenLabel: "API 令牌", signIn: "登录",
      tokenHint: "令牌由管理员用 tasknet-admin 生成；演示环境的令牌是 demo。",
      tokenMissing: "请输入令牌。", tokenRejected: "令牌无效，请检查后重试。",
      cannotReach: "无法连接到站点，请稍后再试。",
      usageTitle: "本周用量", usageText: "{week}：已用 {used} / 额度 {quota}（剩余 {left}）",
      createTitle: "新建任务", upstreamToken: "上游令牌", nameOptional: "名称（可选）", create: "创建",
      creating: "正在提交……",
      gidInvalid: "gid 必须是 1 到 2147483647 之间的整数。", upstreamTokenMissing: "请填写上游令牌。",
      created: "已创建任务 {gid}：上游已接受，正在等待节点下载。",
      createdUnknown: "任务 {gid} 的提交结果未知：上游没有给出明确答复。系统不会自动重试，也不会重复扣费；管理员核对后会处理。",
      createConflict: "gid {gid} 已经有任务了（可能正在处理，或等待管理员核对），没有重复提交。",
      createRejected: "上游拒绝了 gid {gid}，没有扣费：{message}",
      createQuota: "本周额度不够创建这个任务，没有扣费。{message}",
      createInvalid: "输入有误：{message}",
      createUnauthorized: "令牌已失效，请重新登录。",
      createUnavailable: "上游暂时不可用，请求没有发出，也没有扣费；可以稍后再试。{message}",
      createFailed: "创建失败（HTTP {code}）：{message}",
      tasksTitle: "任务", refresh: "刷新", noTasks: "还没有任务。", loadMore: "加载更多",
      favorite: "收藏", unfavorite: "取消收藏", delete: "删除", retryDelete: "重试删除",
      deleteTitle: "删除任务？", deleteText: "删除 {name}（gid {gid}）？节点确认删除文件之前，任务会显示为“待删除”。",
      deleteConfirm: "删除", deleteStarted: "已请求删除 {gid}，等待节点确认。", deleted: "任务 {gid} 已删除。",
      deleteFailed: "删除失败（HTTP {code}）：{message}", favoriteFailed: "收藏操作失败（HTTP {code}）：{message}",
      progress: "进度", node: "节点", cost: "费用", created_at: "创建于",
      unknownTitle: "提交未知的操作", noUnknown: "没有需要核对的操作。",
      unknownHint: "上游没有给出明确答复。请根据证据（特别是上游的审计记录）判断它是否真的提交了；两个结论都不会再次请求上游。",
      evStep: "步骤", evAt: "时间", evError: "错误", evAudit: "上游审计", evOperation: "操作 ID",
      auditUnavailable: "无法取得上游审计：{error}",
      wasSubmitted: "确实已提交", wasNotSubmitted: "没有提交",
      resolveSubmittedTitle: "确认“已提交”？", resolveNotSubmittedTitle: "确认“没有提交”？",
      resolveSubmittedText: "gid {gid} 将按已提交处理：计入用量一次，并派发给节点下载。",
      resolveNotSubmittedText: "gid {gid} 将按未提交处理：释放这个任务，gid 可以重新创建。",
      note: "备注", cancel: "取消", confirm: "确认",
      resolved: "gid {gid} 已处理：{verdict}。", resolveConflict: "gid {gid} 已经不是“提交未知”状态，没有改动。",
      resolveFailed: "处理失败（HTTP {code}）：{message}",
      verdictSubmitted: "已提交", verdictNotSubmitted: "没有提交",
      nodesTitle: "已连接的节点", noNodes: "没有节点在线。", nodeId: "节点", protocol: "协议",
      queue: "已分配任务", revision: "修订号", connectedAt: "连接时间", legacy: "旧版 v1", v2: "v2",
      liveOn: "实时更新中", liveOff: "实时连接断开，正在重连……", loadFailed: "加载失败（HTTP {code}）：{message}",
      signedInAs: "已登录"
    },
    en: {
      skip: "Skip to content", signOut: "Sign out", navTasks: "Tasks", navAdmin: "Admin",
      signInTitle: "Sign in", tokenLabel: "API token", signIn: "Sign in",
      tokenHint: "An admin makes tokens with tasknet-admin; the demo token is demo.",
      tokenMissing: "Enter a token.", tokenRejected: "That token was not accepted. Check it and try again.",
      cannotReach: "Cannot reach the site. Try again later.",
      usageTitle: "This week's usage", usageText: "{week}: used {used} of {quota} ({left} left)",
      createTitle: "New task", upstreamToken: "Upstream token", nameOptional: "Name (optional)", create: "Create",
      creating: "Submitting…",
      gidInvalid: "gid must be a whole number from 1 to 2147483647.", upstreamTokenMissing: "Enter the upstream token.",
      created: "Task {gid} created: the upstream accepted it; waiting for a node to download it.",
      createdUnknown: "Task {gid}: the submission outcome is unknown (the upstream gave no clear answer). It will not be retried or charged twice; an admin will reconcile it.",
      createConflict: "gid {gid} already has a task (in progress, or waiting for an admin to reconcile). Nothing was resubmitted.",
      createRejected: "The upstream refused gid {gid}; nothing was charged: {message}",
      createQuota: "Not enough quota left this week for this task; nothing was charged. {message}",
      createInvalid: "Please fix the input: {message}",
      createUnauthorized: "Your token is no longer valid. Please sign in again.",
      createUnavailable: "The upstream is unavailable; nothing was sent and nothing charged. Try again later. {message}",
      createFailed: "Create failed (HTTP {code}): {message}",
      tasksTitle: "Tasks", refresh: "Refresh", noTasks: "No tasks yet.", loadMore: "Load more",
      favorite: "Favorite", unfavorite: "Remove favorite", delete: "Delete", retryDelete: "Retry delete",
      deleteTitle: "Delete this task?", deleteText: "Delete {name} (gid {gid})? Until the node confirms the files are gone the task shows “Delete pending”.",
      deleteConfirm: "Delete", deleteStarted: "Delete of {gid} requested; waiting for the node to confirm.", deleted: "Task {gid} deleted.",
      deleteFailed: "Delete failed (HTTP {code}): {message}", favoriteFailed: "Favorite failed (HTTP {code}): {message}",
      progress: "Progress", node: "Node", cost: "Cost", created_at: "Created",
      unknownTitle: "Operations with unknown outcome", noUnknown: "Nothing to reconcile.",
      unknownHint: "The upstream gave no clear answer. Judge from the evidence (above all the upstream's audit record) whether it was really submitted; neither verdict calls the upstream again.",
      evStep: "Step", evAt: "Time", evError: "Error", evAudit: "Upstream audit", evOperation: "Operation ID",
      auditUnavailable: "Upstream audit unavailable: {error}",
      wasSubmitted: "It was submitted", wasNotSubmitted: "It was not submitted",
      resolveSubmittedTitle: "Mark as submitted?", resolveNotSubmittedTitle: "Mark as not submitted?",
      resolveSubmittedText: "gid {gid} will count as submitted: metered once and dispatched to a node.",
      resolveNotSubmittedText: "gid {gid} will count as not submitted: the task is released and the gid can be created again.",
      note: "Note", cancel: "Cancel", confirm: "Confirm",
      resolved: "gid {gid} resolved: {verdict}.", resolveConflict: "gid {gid} is no longer unknown; nothing changed.",
      resolveFailed: "Resolve failed (HTTP {code}): {message}",
      verdictSubmitted: "submitted", verdictNotSubmitted: "not submitted",
      nodesTitle: "Connected nodes", noNodes: "No node is connected.", nodeId: "Node", protocol: "Protocol",
      queue: "Assigned", revision: "Revision", connectedAt: "Connected", legacy: "legacy v1", v2: "v2",
      liveOn: "Live", liveOff: "Live updates disconnected; reconnecting…", loadFailed: "Loading failed (HTTP {code}): {message}",
      signedInAs: "Signed in"
    }
  };

  var state = {
    token: null,
    lang: "zh",
    tasks: new Map(),      // gid -> task object as the API sends it
    order: [],             // gids, newest first, as listed
    favorites: new Set(),
    next: null,
    isAdmin: false,
    socket: null,
    backoff: 500,
    reconnectTimer: null,
    pollTimer: null,
    unknownTimer: null,
    nodesTimer: null
  };

  function $(id) { return document.getElementById(id); }

  function t(key, params) {
    var table = STRINGS[state.lang] || STRINGS.zh;
    var text = key in table ? table[key] : (STRINGS.zh[key] || key);
    if (params) {
      text = text.replace(/\{(\w+)\}/g, function (m, name) {
        return name in params && params[name] !== null && params[name] !== undefined ? String(params[name]) : "";
      });
    }
    return text.trim();
  }

  function statusLabel(task) {
    var entry = task.status && LABELS[task.status];
    if (entry) { return entry[state.lang] || entry.zh; }
    return task.statusText || task.status || "";
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (name) {
        var value = attrs[name];
        if (value === null || value === undefined || value === false) { return; }
        if (name === "text") { node.textContent = value; }
        else if (name === "className") { node.className = value; }
        else { node.setAttribute(name, value === true ? "" : String(value)); }
      });
    }
    (children || []).forEach(function (child) { if (child) { node.appendChild(child); } });
    return node;
  }

  function formatTime(value) {
    if (value === null || value === undefined || value === "") { return ""; }
    var date;
    if (typeof value === "number") { date = new Date(value > 1e12 ? value : value * 1000); }
    else { date = new Date(value); }
    if (isNaN(date.getTime())) { return String(value); }
    return date.toLocaleString(state.lang === "zh" ? "zh-CN" : "en-GB");
  }

  function notify(text, isError) {
    var box = $("notice");
    box.textContent = text || "";
    box.classList.toggle("error", !!isError);
  }

  // ---- HTTP ---------------------------------------------------------------

  function api(method, path, body) {
    var headers = { "Accept": "application/json" };
    if (state.token) { headers["Authorization"] = "Bearer " + state.token; }
    var init = { method: method, headers: headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(path, init).then(function (response) {
      return response.text().then(function (text) {
        var data = null;
        if (text) { try { data = JSON.parse(text); } catch (e) { data = null; } }
        return { status: response.status, ok: response.ok, data: data };
      });
    }, function () {
      return { status: 0, ok: false, data: null };
    });
  }

  function errorMessage(result) {
    var err = result.data && result.data.error;
    if (err && err.message) { return err.message; }
    if (result.status === 0) { return t("cannotReach"); }
    return "";
  }

  // ---- sign in ------------------------------------------------------------

  function showSignedIn(signedIn) {
    $("sign-in").hidden = signedIn;
    $("app").hidden = !signedIn;
    $("nav").hidden = !signedIn;
    $("sign-out").hidden = !signedIn;
  }

  function signIn(token) {
    state.token = token;
    return api("GET", "/api/usage").then(function (result) {
      if (result.status === 401) {
        state.token = null;
        localStorage.removeItem(TOKEN_KEY);
        return { ok: false, message: t("tokenRejected") };
      }
      if (!result.ok) {
        state.token = null;
        return { ok: false, message: result.status === 0 ? t("cannotReach") : t("loadFailed", { code: result.status, message: errorMessage(result) }) };
      }
      localStorage.setItem(TOKEN_KEY, token);
      showSignedIn(true);
      renderUsage(result.data);
      startSession();
      return { ok: true };
    });
  }

  function signOut() {
    stopSession();
    state.token = null;
    localStorage.removeItem(TOKEN_KEY);
    state.tasks.clear();
    state.order = [];
    state.favorites.clear();
    $("task-list").textContent = "";
    showSignedIn(false);
    $("admin-section").hidden = true;
    $("nav-admin").hidden = true;
    notify("");
    $("token-input").value = "";
    $("token-input").focus();
  }

  function startSession() {
    loadFavorites().then(function () { return loadTasks(false); });
    detectAdmin();
    connectEvents();
  }

  function stopSession() {
    if (state.reconnectTimer) { clearTimeout(state.reconnectTimer); state.reconnectTimer = null; }
    if (state.pollTimer) { clearInterval(state.pollTimer); state.pollTimer = null; }
    if (state.unknownTimer) { clearInterval(state.unknownTimer); state.unknownTimer = null; }
    if (state.nodesTimer) { clearTimeout(state.nodesTimer); state.nodesTimer = null; }
    if (state.socket) {
      var socket = state.socket;
      state.socket = null;
      socket.onclose = null;
      socket.close();
    }
    setLive(false);
  }

  // ---- usage --------------------------------------------------------------

  function renderUsage(usage) {
    if (!usage) { return; }
    var quota = Number(usage.quota) || 0;
    var used = Number(usage.used) || 0;
    var meter = $("usage-meter");
    meter.max = Math.max(quota, 1);
    meter.value = Math.min(used, meter.max);
    meter.low = meter.max * 0.7;
    meter.high = meter.max * 0.9;
    meter.optimum = 0;
    $("usage-text").textContent = t("usageText", { week: usage.week, used: used, quota: quota, left: Math.max(quota - used, 0) });
    state.usage = usage;
  }

  function loadUsage() {
    return api("GET", "/api/usage").then(function (result) {
      if (result.ok) { renderUsage(result.data); }
    });
  }

  // ---- tasks --------------------------------------------------------------

  function taskName(task) { return task.name || ("gid " + task.gid); }

  function isGone(task) { return task && task.state === "DELETED"; }

  function loadTasks(append) {
    var path = "/api/tasks?limit=" + PAGE_SIZE;
    if (append && state.next !== null && state.next !== undefined) { path += "&after=" + encodeURIComponent(state.next); }
    return api("GET", path).then(function (result) {
      if (result.status === 401) { signOut(); return; }
      if (!result.ok) { notify(t("loadFailed", { code: result.status, message: errorMessage(result) }), true); return; }
      var tasks = (result.data && result.data.tasks) || [];
      if (!append) { state.tasks.clear(); state.order = []; }
      tasks.forEach(function (task) {
        if (isGone(task)) { return; }
        if (!state.tasks.has(task.gid)) { state.order.push(task.gid); }
        state.tasks.set(task.gid, task);
      });
      state.next = result.data ? result.data.next : null;
      renderTaskList();
    });
  }

  function upsertTask(task) {
    if (!task || task.gid === undefined) { return; }
    if (isGone(task)) { removeTask(task.gid); return; }
    if (!state.tasks.has(task.gid)) { state.order.unshift(task.gid); }
    state.tasks.set(task.gid, task);
    var row = document.querySelector('#task-list > li[data-gid="' + task.gid + '"]');
    var fresh = renderTask(task);
    var updates = row ? Number(row.getAttribute("data-live-updates") || 0) : 0;
    fresh.setAttribute("data-live-updates", String(updates));
    if (row) { keepFocus(row, fresh); row.replaceWith(fresh); }
    else { $("task-list").prepend(fresh); }
    $("tasks-empty").hidden = state.order.length > 0;
    schedulePendingPoll();
    return fresh;
  }

  function removeTask(gid) {
    var wasKnown = state.tasks.delete(gid);
    state.order = state.order.filter(function (g) { return g !== gid; });
    state.favorites.delete(gid);
    var row = document.querySelector('#task-list > li[data-gid="' + gid + '"]');
    if (row) {
      var hadFocus = row.contains(document.activeElement);
      row.remove();
      if (hadFocus) { $("tasks-title").setAttribute("tabindex", "-1"); $("tasks-title").focus(); }
    }
    if (wasKnown) { notify(t("deleted", { gid: gid })); loadUsage(); }
    $("tasks-empty").hidden = state.order.length > 0;
  }

  // Re-rendering a row must not throw keyboard focus away.
  function keepFocus(oldRow, newRow) {
    var active = document.activeElement;
    if (!active || !oldRow.contains(active) || !active.dataset.action) { return; }
    var action = active.dataset.action;
    setTimeout(function () {
      var target = newRow.querySelector('[data-action="' + action + '"]');
      if (target) { target.focus(); }
    }, 0);
  }

  function renderTaskList() {
    var list = $("task-list");
    list.textContent = "";
    state.order.forEach(function (gid) { list.appendChild(renderTask(state.tasks.get(gid))); });
    $("tasks-empty").hidden = state.order.length > 0;
    $("tasks-more").hidden = state.next === null || state.next === undefined;
    schedulePendingPoll();
  }

  function renderTask(task) {
    var percent = Math.round(Math.max(0, Math.min(1, Number(task.progress) || 0)) * 100);
    if (task.status === "COMPLETED") { percent = 100; }
    var label = statusLabel(task);
    var favorite = state.favorites.has(task.gid);
    var titleId = "task-title-" + task.gid;

    var bar = el("div", {
      className: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100,
      "aria-valuenow": percent, "aria-labelledby": titleId, "data-progress": percent
    }, [el("div", { className: "bar-fill", style: "width:" + percent + "%" })]);

    var actions = el("div", { className: "task-actions" }, [
      el("button", {
        type: "button", className: "star", "data-action": "favorite", "aria-pressed": favorite ? "true" : "false",
        "aria-label": (favorite ? t("unfavorite") : t("favorite")) + " " + taskName(task), title: favorite ? t("unfavorite") : t("favorite"),
        text: favorite ? "★" : "☆"
      })
    ]);
    if (canDelete(task)) {
      actions.appendChild(el("button", {
        type: "button", className: "danger", "data-action": "delete",
        "aria-label": (task.status === "DELETE_FAILED" ? t("retryDelete") : t("delete")) + " " + taskName(task),
        text: task.status === "DELETE_FAILED" ? t("retryDelete") : t("delete")
      }));
    }

    var meta = [];
    meta.push("gid " + task.gid);
    if (task.node) { meta.push(t("node") + " " + task.node); }
    if (task.cost !== null && task.cost !== undefined) { meta.push(t("cost") + " " + task.cost); }
    if (task.createdAt) { meta.push(t("created_at") + " " + formatTime(task.createdAt)); }

    return el("li", { className: "task", "data-gid": task.gid, "data-status": task.status || "" }, [
      el("div", { className: "task-head" }, [
        el("h3", { id: titleId, className: "task-title", text: taskName(task) }),
        el("span", { className: "status status-" + String(task.status || "").toLowerCase(), "data-role": "status", text: label })
      ]),
      el("div", { className: "progress-row" }, [
        bar, el("span", { className: "percent", "aria-hidden": "true", text: percent + "%" })
      ]),
      el("div", { className: "task-foot" }, [el("p", { className: "meta", text: meta.join(" · ") }), actions])
    ]);
  }

  function canDelete(task) {
    // SUBMITTING and SUBMIT_UNKNOWN wait for the lifecycle or an admin;
    // DELETE_PENDING already waits for the node.
    return ["SUBMITTING", "SUBMIT_UNKNOWN", "DELETE_PENDING"].indexOf(task.status) === -1;
  }

  // While a delete waits for the node, ask now and then whether it finished,
  // in case the push that says so was missed (e.g. during a reconnect).
  function schedulePendingPoll() {
    var pending = state.order.some(function (gid) {
      var task = state.tasks.get(gid);
      return task && task.status === "DELETE_PENDING";
    });
    if (pending && !state.pollTimer) {
      state.pollTimer = setInterval(pollPending, 5000);
    } else if (!pending && state.pollTimer) {
      clearInterval(state.pollTimer);
      state.pollTimer = null;
    }
  }

  function pollPending() {
    state.order.forEach(function (gid) {
      var task = state.tasks.get(gid);
      if (!task || task.status !== "DELETE_PENDING") { return; }
      api("GET", "/api/tasks/" + gid).then(function (result) {
        if (result.status === 404) { removeTask(gid); }
        else if (result.ok && result.data && result.data.task) { upsertTask(result.data.task); }
      });
    });
  }

  // ---- create -------------------------------------------------------------

  function onCreate(event) {
    event.preventDefault();
    var gidText = $("create-gid").value.trim();
    var token = $("create-token").value.trim();
    var name = $("create-name").value.trim();
    var result = $("create-result");
    result.classList.remove("error", "ok", "warn");
    if (!/^[0-9]+$/.test(gidText) || Number(gidText) < 1 || Number(gidText) > 2147483647) {
      result.textContent = t("gidInvalid"); result.classList.add("error"); $("create-gid").focus(); return;
    }
    if (!token) {
      result.textContent = t("upstreamTokenMissing"); result.classList.add("error"); $("create-token").focus(); return;
    }
    var gid = Number(gidText);
    var body = { gid: gid, token: token };
    if (name) { body.name = name; }
    var button = $("create-submit");
    button.disabled = true;
    result.textContent = t("creating");
    api("POST", "/api/tasks", body).then(function (response) {
      button.disabled = false;
      var params = { gid: gid, message: errorMessage(response), code: response.status };
      var outcome = createOutcome(response.status);
      result.textContent = t(outcome.key, params);
      result.classList.add(outcome.tone);
      result.setAttribute("data-outcome", String(response.status));
      result.setAttribute("data-gid", String(gid));
      if (response.data && response.data.task) { upsertTask(response.data.task); }
      if (response.status === 201 || response.status === 202) {
        $("create-gid").value = ""; $("create-name").value = "";
        loadUsage();
        if (state.isAdmin && response.status === 202) { loadUnknown(); }
      }
      if (response.status === 401) { signOut(); notify(t("createUnauthorized"), true); }
    });
  }

  function createOutcome(status) {
    switch (status) {
      case 201: return { key: "created", tone: "ok" };
      case 202: return { key: "createdUnknown", tone: "warn" };
      case 409: return { key: "createConflict", tone: "warn" };
      case 422: return { key: "createRejected", tone: "error" };
      case 429: return { key: "createQuota", tone: "error" };
      case 400: return { key: "createInvalid", tone: "error" };
      case 401: return { key: "createUnauthorized", tone: "error" };
      case 502: return { key: "createUnavailable", tone: "error" };
      default: return { key: "createFailed", tone: "error" };
    }
  }

  // ---- favorites and delete --------------------------------------------------

  function loadFavorites() {
    return api("GET", "/api/favorites").then(function (result) {
      if (!result.ok) { return; }
      state.favorites = new Set(favoriteGids(result.data));
    });
  }

  // Accepts {"favorites": [gid | {gid}]}, {"gids": [...]}, {"tasks": [...]} or a bare list.
  function favoriteGids(data) {
    var list = Array.isArray(data) ? data : (data && (data.favorites || data.gids || data.tasks)) || [];
    return list.map(function (item) { return typeof item === "object" && item !== null ? item.gid : item; })
      .filter(function (gid) { return gid !== undefined && gid !== null; })
      .map(Number);
  }

  function toggleFavorite(gid) {
    var on = !state.favorites.has(gid);
    api(on ? "PUT" : "DELETE", "/api/favorites/" + gid).then(function (result) {
      if (!result.ok) { notify(t("favoriteFailed", { code: result.status, message: errorMessage(result) }), true); return; }
      if (on) { state.favorites.add(gid); } else { state.favorites.delete(gid); }
      var task = state.tasks.get(gid);
      if (task) { upsertTask(task); }
    });
  }

  function confirmDialog(options) {
    var dialog = $("confirm-dialog");
    $("confirm-title").textContent = options.title;
    $("confirm-text").textContent = options.text;
    $("confirm-ok").textContent = options.ok;
    $("confirm-ok").className = options.danger ? "danger" : "primary";
    $("confirm-note-field").hidden = !options.note;
    $("confirm-note").value = "";
    var opener = document.activeElement;
    return new Promise(function (resolve) {
      dialog.addEventListener("close", function onClose() {
        dialog.removeEventListener("close", onClose);
        if (opener && document.contains(opener)) { opener.focus(); }
        resolve(dialog.returnValue === "ok" ? { note: $("confirm-note").value.trim() } : null);
      });
      dialog.returnValue = "";
      dialog.showModal();
      (options.note ? $("confirm-note") : $("confirm-cancel")).focus();
    });
  }

  function deleteTask(gid) {
    var task = state.tasks.get(gid);
    if (!task) { return; }
    confirmDialog({
      title: t("deleteTitle"), text: t("deleteText", { gid: gid, name: taskName(task) }),
      ok: t("deleteConfirm"), danger: true
    }).then(function (answer) {
      if (!answer) { return; }
      api("DELETE", "/api/tasks/" + gid).then(function (result) {
        if (result.status === 200 && result.data && result.data.deleted !== undefined) { removeTask(gid); return; }
        if (result.ok && result.data && result.data.task) {
          upsertTask(result.data.task);
          notify(t("deleteStarted", { gid: gid }));
          return;
        }
        if (result.status === 404) { removeTask(gid); return; }
        notify(t("deleteFailed", { code: result.status, message: errorMessage(result) }), true);
      });
    });
  }

  function onTaskListClick(event) {
    var button = event.target.closest("button[data-action]");
    if (!button) { return; }
    var gid = Number(button.closest("li[data-gid]").getAttribute("data-gid"));
    if (button.dataset.action === "favorite") { toggleFavorite(gid); }
    else if (button.dataset.action === "delete") { deleteTask(gid); }
  }

  // ---- live events ------------------------------------------------------------

  function setLive(on) {
    var live = $("live");
    live.setAttribute("data-state", on ? "online" : "offline");
    live.textContent = state.token ? (on ? t("liveOn") : t("liveOff")) : "";
  }

  function connectEvents() {
    if (!state.token) { return; }
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + location.host + "/api/events?token=" + encodeURIComponent(state.token));
    state.socket = socket;
    socket.onopen = function () {
      state.backoff = 500;
      setLive(true);
      // Pushes sent while we were away are gone: catch up from the API.
      loadTasks(false);
      loadUsage();
    };
    socket.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (!message || message.type !== "task" || !message.task) { return; }
      var row = upsertTask(message.task);
      if (row) { row.setAttribute("data-live-updates", String(Number(row.getAttribute("data-live-updates") || 0) + 1)); }
      if (state.isAdmin) {
        if (message.task.status === "SUBMIT_UNKNOWN") { loadUnknown(); }
        scheduleNodesRefresh();
      }
    };
    socket.onclose = function () {
      if (state.socket !== socket) { return; }
      state.socket = null;
      setLive(false);
      // Reconnect with exponential backoff (0.5 s doubling, capped at 15 s, jittered).
      var delay = state.backoff * (0.8 + Math.random() * 0.4);
      state.backoff = Math.min(state.backoff * 2, 15000);
      state.reconnectTimer = setTimeout(function () { state.reconnectTimer = null; connectEvents(); }, delay);
    };
  }

  // ---- admin ------------------------------------------------------------------

  function detectAdmin() {
    return api("GET", "/api/admin/unknown").then(function (result) {
      state.isAdmin = result.ok;
      $("admin-section").hidden = !result.ok;
      $("nav-admin").hidden = !result.ok;
      if (!result.ok) { return; }
      renderUnknown(result.data);
      loadNodes();
      if (!state.unknownTimer) {
        state.unknownTimer = setInterval(function () { loadNodes(); }, 10000);
      }
    });
  }

  function loadUnknown() {
    return api("GET", "/api/admin/unknown").then(function (result) {
      if (result.ok) { renderUnknown(result.data); }
      else { notify(t("loadFailed", { code: result.status, message: errorMessage(result) }), true); }
    });
  }

  var EVIDENCE_LABELS = {
    step: "evStep", at: "evAt", time: "evAt", unknownAt: "evAt", error: "evError",
    audit: "evAudit", upstream: "evAudit", upstreamAudit: "evAudit", operationId: "evOperation"
  };

  function evidenceValue(key, value) {
    if (value === null || value === undefined) { return "—"; }
    // The site's audit answer: {"available": true, "audit": {...}} or
    // {"available": false, "error": "..."}; show the answer itself.
    if (value && typeof value === "object" && "available" in value) {
      if (!value.available) { return t("auditUnavailable", { error: value.error || "" }); }
      value = value.audit || {};
    }
    if ((key === "at" || key === "time" || /At$/.test(key)) && (typeof value === "number" || typeof value === "string")) { return formatTime(value); }
    if (typeof value === "object") {
      return Object.keys(value).map(function (k) {
        var v = value[k];
        if (/At$/.test(k) && v) { v = formatTime(v); }
        return k + ": " + (typeof v === "object" && v !== null ? JSON.stringify(v) : v);
      }).join(", ");
    }
    return String(value);
  }

  function renderUnknown(data) {
    var list = $("unknown-list");
    list.textContent = "";
    var tasks = (data && data.tasks) || [];
    $("unknown-empty").hidden = tasks.length > 0;
    tasks.forEach(function (task) {
      var evidence = task.evidence || {};
      var rows = [];
      Object.keys(evidence).forEach(function (key) {
        rows.push(el("dt", { text: EVIDENCE_LABELS[key] ? t(EVIDENCE_LABELS[key]) : key }));
        rows.push(el("dd", { text: evidenceValue(key, evidence[key]) }));
      });
      if (task.operationId && !("operationId" in evidence)) {
        rows.push(el("dt", { text: t("evOperation") }));
        rows.push(el("dd", { text: task.operationId }));
      }
      list.appendChild(el("li", { className: "unknown-item", "data-gid": task.gid }, [
        el("h3", { text: taskName(task) + " · gid " + task.gid }),
        el("dl", { className: "evidence" }, rows),
        el("div", { className: "task-actions" }, [
          el("button", { type: "button", "data-verdict": "submitted", className: "primary", text: t("wasSubmitted") }),
          el("button", { type: "button", "data-verdict": "not_submitted", text: t("wasNotSubmitted") })
        ])
      ]));
    });
  }

  function onUnknownClick(event) {
    var button = event.target.closest("button[data-verdict]");
    if (!button) { return; }
    var gid = Number(button.closest("li[data-gid]").getAttribute("data-gid"));
    var verdict = button.getAttribute("data-verdict");
    var submitted = verdict === "submitted";
    confirmDialog({
      title: t(submitted ? "resolveSubmittedTitle" : "resolveNotSubmittedTitle"),
      text: t(submitted ? "resolveSubmittedText" : "resolveNotSubmittedText", { gid: gid }),
      ok: t(submitted ? "wasSubmitted" : "wasNotSubmitted"), note: true
    }).then(function (answer) {
      if (!answer) { return; }
      var body = { verdict: verdict };
      if (answer.note) { body.note = answer.note; }
      api("POST", "/api/admin/tasks/" + gid + "/resolve", body).then(function (result) {
        if (result.ok) {
          notify(t("resolved", { gid: gid, verdict: t(submitted ? "verdictSubmitted" : "verdictNotSubmitted") }));
          // The create form's "outcome unknown" message about this gid is settled now.
          var createResult = $("create-result");
          if (createResult.getAttribute("data-gid") === String(gid)) {
            createResult.textContent = "";
            createResult.removeAttribute("data-outcome");
            createResult.removeAttribute("data-gid");
          }
          if (result.data && result.data.task) { upsertTask(result.data.task); } else { removeTask(gid); }
          loadUsage();
        } else if (result.status === 409) {
          notify(t("resolveConflict", { gid: gid }), true);
        } else {
          notify(t("resolveFailed", { code: result.status, message: errorMessage(result) }), true);
        }
        loadUnknown();
      });
    });
  }

  // Assignments change with task pushes; refresh the node table at most once a second.
  function scheduleNodesRefresh() {
    if (state.nodesTimer) { return; }
    state.nodesTimer = setTimeout(function () { state.nodesTimer = null; loadNodes(); }, 1000);
  }

  function loadNodes() {
    return api("GET", "/api/admin/nodes").then(function (result) {
      if (!result.ok) { return; }
      var nodes = (result.data && result.data.nodes) || [];
      if (!Array.isArray(nodes)) { nodes = nodes.nodes || []; }
      var body = $("nodes-body");
      body.textContent = "";
      nodes.forEach(function (node) {
        var features = (node.features || []).join(", ");
        body.appendChild(el("tr", { "data-node": node.id }, [
          el("th", { scope: "row", text: node.id }),
          el("td", { text: (node.protocol === 1 ? t("legacy") : t("v2")) + (features ? " (" + features + ")" : "") }),
          el("td", { text: node.assigned === undefined || node.assigned === null ? "—" : String(node.assigned) }),
          el("td", { text: node.lastRevision === undefined || node.lastRevision === null ? "—" : String(node.lastRevision) }),
          el("td", { text: formatTime(node.connectedAt) })
        ]));
      });
      $("nodes-table").hidden = nodes.length === 0;
      $("nodes-empty").hidden = nodes.length > 0;
    });
  }

  // ---- language -----------------------------------------------------------------

  function applyLanguage() {
    document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
    document.querySelectorAll("[data-i18n]").forEach(function (node) { node.textContent = t(node.getAttribute("data-i18n")); });
    var toggle = $("lang-toggle");
    // The toggle names the language it switches to, in that language.
    toggle.textContent = state.lang === "zh" ? "English" : "中文";
    toggle.setAttribute("lang", state.lang === "zh" ? "en" : "zh-CN");
    toggle.setAttribute("aria-label", state.lang === "zh" ? "Switch to English" : "切换到中文");
    if (state.usage) { renderUsage(state.usage); }
    if (state.token) {
      renderTaskList();
      setLive(state.socket !== null && state.socket.readyState === WebSocket.OPEN);
      if (state.isAdmin) { loadUnknown(); loadNodes(); }
    }
  }

  // ---- start ----------------------------------------------------------------------

  function init() {
    var savedLang = localStorage.getItem(LANG_KEY);
    state.lang = savedLang === "en" ? "en" : "zh";
    applyLanguage();

    $("lang-toggle").addEventListener("click", function () {
      state.lang = state.lang === "zh" ? "en" : "zh";
      localStorage.setItem(LANG_KEY, state.lang);
      applyLanguage();
    });
    $("sign-out").addEventListener("click", signOut);
    $("sign-in-form").addEventListener("submit", function (event) {
      event.preventDefault();
      var token = $("token-input").value.trim();
      var error = $("sign-in-error");
      if (!token) { error.textContent = t("tokenMissing"); $("token-input").focus(); return; }
      error.textContent = "";
      signIn(token).then(function (outcome) {
        if (!outcome.ok) { error.textContent = outcome.message; $("token-input").focus(); }
        else { $("create-gid").focus(); }
      });
    });
    $("create-form").addEventListener("submit", onCreate);
    $("task-list").addEventListener("click", onTaskListClick);
    $("tasks-refresh").addEventListener("click", function () { loadTasks(false); loadUsage(); });
    $("tasks-more").addEventListener("click", function () { loadTasks(true); });
    $("unknown-list").addEventListener("click", onUnknownClick);
    $("unknown-refresh").addEventListener("click", loadUnknown);
    $("nodes-refresh").addEventListener("click", loadNodes);

    var saved = localStorage.getItem(TOKEN_KEY);
    if (saved) {
      signIn(saved).then(function (outcome) {
        if (!outcome.ok) { showSignedIn(false); $("sign-in-error").textContent = outcome.message; }
      });
    } else {
      showSignedIn(false);
    }
  }

  init();
})();
