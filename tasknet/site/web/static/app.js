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
  // Where an older version kept the API token; cleared at start (the token
  // now lives only in the site's HttpOnly session cookie).
  var OLD_TOKEN_KEY = "tasknet.token";
  var LANG_KEY = "tasknet.lang";
  var PAGE_SIZE = 50;

  var STRINGS = {
    zh: {
      taskOpen: "历史与详情", taskTitle: "任务 {gid}", taskBack: "返回任务列表", taskLoading: "正在读取……",
      taskOwner: "所有者", taskNode: "节点", taskOperationId: "生成（operationId）", taskDeleteOperationId: "删除操作（deleteOperationId）",
      taskCost: "费用", taskCostPoints: "{cost} 点", taskMetered: "已计入 {week} 的额度", taskNotMetered: "未计费",
      taskStep: "最后到达的步骤", taskError: "变为未知的原因", taskUnknownAt: "变为未知于", taskCreatedAt: "创建于", taskUpdatedAt: "最后变化于",
      taskArchiveGone: "归档已不在：{reason}（{at}，节点 {node}）", taskDeleteReason: "删除失败的原因",
      historyTitle: "历史", historyEmpty: "没有记录的变化。", historyOnNode: "节点 {node}",
      historyVerdict: "{actor} 裁定：{verdict}", verdictSubmitted: "已提交", verdictNotSubmitted: "未提交",
      historyForceDelete: "{actor} 强制删除（节点 {node}）", historyNote: "备注：{note}",
      historyCreated: "创建", historyCreatedCost: "创建（费用 {cost} 点）", historyTruncated: "只显示最近 2,000 次记录的变化。",
      evidenceTitle: "上游的证据（最后一次裁定所依据的）", taskReconcile: "去核对这个任务", taskNotFound: "没有这个任务（或不是你的）。",
      skip: "跳到内容", signOut: "退出", navTasks: "任务", navAdmin: "管理",
      signInTitle: "登录", tokenLabel: "API 令牌", signIn: "登录",
      tokenHint: "令牌由管理员生成（管理 → 用户，或 tasknet-admin user add）。",
      tokenMissing: "请输入令牌。", tokenRejected: "令牌无效，请检查后重试。",
      firstAdminHint: "第一个管理员在站点主机上创建：tasknet-admin --db 站点数据库 user add 名字 --admin（它会打印令牌）。",
      demoHint: "这是演示站点（--demo）：令牌是 demo。",
      accountDisabled: "这个账户已被管理员停用：请联系管理员重新启用。",
      usersTitle: "用户", userName: "用户名", userRole: "角色", roleAdmin: "管理员", roleUser: "普通用户",
      userQuota: "每周额度（点）", userState: "状态", userEnabled: "正常", userDisabledSince: "已停用（{at}）",
      userSessions: "会话", userCreated: "创建于", userActions: "操作", userYou: "{name}（你）",
      userAdd: "添加用户", userAdminBox: "管理员（可查看所有任务，管理节点和用户）", userQuotaDefault: "留空：站点默认额度",
      userSaveQuota: "保存额度", userDisable: "停用", userEnable: "启用", userRotate: "更换令牌", userEndSessions: "结束会话",
      userDisableTitle: "停用 {name}？", userDisableText: "{name} 的令牌和所有浏览器会话会立即失效；它的任务保留并继续。以后可以重新启用。",
      userRotateTitle: "给 {name} 换一个新令牌？", userRotateText: "旧令牌和 {name} 的所有浏览器会话会立即失效。新令牌只显示这一次。",
      userEndTitle: "结束 {name} 的所有会话？", userEndText: "{name} 的浏览器需要重新登录；令牌仍然有效。",
      userAdded: "已添加用户 {name}。", userTokenShown: "{name} 的令牌（只显示这一次：请现在复制，并安全地交给对方）：",
      userDisabledDone: "{name} 已停用（结束了 {n} 个会话）。", userEnabledDone: "{name} 已重新启用。",
      userQuotaSaved: "{name} 的每周额度现在是 {quota} 点。", userSessionsEnded: "已结束 {name} 的 {n} 个会话。",
      userNameInvalid: "用户名是 1 到 64 个字母、数字、“_”、“.” 或 “-”。", userQuotaInvalid: "额度是 0 到 1,000,000,000 之间的整数。",
      userExists: "已经有名为 {name} 的用户了。", userSelf: "不能停用你自己的账户。", userActionFailed: "没有完成：{message}", userRotated: "{name} 有了新令牌（见下方）。",
      upstreamDownCreate: "上游没有响应（刚才的创建请求连不上它）：它恢复之前无法提交新任务；没有扣费。",
      upstreamDownDownloads: "上游没有响应：{n} 个下载连不上它，会自动重试。",
      upstreamDownDownloadsOne: "上游没有响应：1 个下载连不上它，会自动重试。",
      speedNotYet: "尚未测出（等待节点的下一次报告）", speedLegacy: "旧版节点不报告速度（只报告进度）",
      cannotReach: "站点无法访问：请检查网络连接后再试。",
      usageTitle: "本周用量", usageText: "{week}：已用 {used} 点 / 额度 {quota} 点（剩余 {left} 点）",
      createTitle: "新建任务", upstreamToken: "上游令牌", nameOptional: "名称（可选）", create: "创建",
      creating: "正在提交……",
      navLabel: "页面", navCharts: "图表",
      creatingPhase: "正在提交到上游…… {n} 秒",
      creatingSlow: "上游答复很慢。站点最多等到它的超时时间；仍没有明确答复时，任务会标为“提交未知”，不会重复提交或扣费。",
      createConflictOwn: "你已经有 gid {gid} 的任务了（{status}），没有重复提交。",
      createConflictAdmin: "gid {gid} 已经有任务了（{status}，所有者 {owner}），没有重复提交。",
      createConflictOther: "gid {gid} 已被另一位用户占用：一个 gid 只能有一个任务。请换一个 gid。",
      filterStatus: "按状态筛选", tabAll: "全部", tabActive: "进行中", tabCompleted: "已完成", tabAttention: "需处理",
      search: "搜索", searchHint: "名称或 gid 的一部分", order: "排序",
      orderNewest: "最新在前", orderOldest: "最早在前", orderGid: "按 gid",
      staleBanner: "实时连接已断开：进度和速度可能已过时。", staleMark: "已过时", noMatch: "没有符合条件的任务。",
      size: "大小", downloaded: "已下载", speed: "速度", eta: "剩余时间", owner: "所有者", completedAt: "完成于",
      bytesOf: "{done} / {size}",
      chartsTitle: "图表", chartsHint: "每分钟一个点（6 小时和 24 小时：每 15 分钟一个点）。", chartsWindow: "时间范围",
      window15m: "最近 15 分钟", window1h: "最近 1 小时", window6h: "最近 6 小时", window24h: "最近 24 小时",
      option15m: "最近 15 分钟", option1h: "最近 1 小时", option6h: "最近 6 小时", option24h: "最近 24 小时",
      chartThroughput: "下载速度", chartNodes: "各节点下载量", chartUsage: "每周用量与额度",
      chartThroughputLabel: "{window}的下载速度：共 {bytes}，峰值 {peak}（每 {bucket}的平均速度），完成 {completed} 个任务。",
      bucketMinute: "1 分钟", bucketMinutes: "{n} 分钟",
      chartNodesEmpty: "{window}没有节点下载。", chartNodesLabel: "{window}各节点的下载量：{list}。", chartOtherNodes: "其他 {n} 个节点",
      chartUsageLabel: "最近 8 周的用量（点），本周已用 {used} 点 / 额度 {quota} 点。", quotaLine: "额度 {quota} 点",
      nodeState: "状态", activeTasks: "任务", nodeSpeed: "速度", nodeSite: "站点", runningQueued: "{running} 个运行中，{queued} 个排队", lastReport: "上次报告",
      droppedEntries: "丢弃的报告", connectedSince: "连接 / 最后在线",
      nodeArchives: "归档", nodeBytesHeld: "占用空间", nodeFree: "剩余空间",
      nodeActions: "操作", reassignNode: "转移任务", retireNode: "退役",
      reassignTitle: "转移 {node} 的未完成任务？",
      reassignText: "{node} 上未完成的任务会立即交给其他已连接的节点（没有已连接的节点时，等待节点），沿用原来的操作 ID：不会再次向上游提交，也不会再次扣费，只是重新下载。{node} 回来时会收到取消命令。审计日志会记下你的备注。",
      retireTitle: "让 {node} 退役？",
      retireText: "{node} 将永久停用：未完成的任务转给其他节点，它已完成的任务的归档标记为已失效（节点已退役），它的密钥被删除，不能再登录，当前连接会被断开。审计日志会记下你的备注。",
      reassigned: "已从 {node} 转移 {n} 个任务（{sent} 个已发给其他节点，{waiting} 个等待节点）。",
      retired: "{node} 已退役：转移 {n} 个任务，{archives} 个归档标记为已失效。",
      nodeActionFailed: "操作失败：{message}",
      heldTasks: "持有 {n} 个（离线，未在下载）",
      drainNode: "排空", pauseNode: "暂停派发", resumeNode: "恢复", nodeLimit: "下载上限", setLimit: "设置",
      noLimit: "不限", limitShown: "上限 {n}", modeDraining: "排空中，还剩 {n} 个", modeDrained: "已排空",
      modePaused: "已暂停派发", modeActive: "接收新任务", modeDrainingShort: "排空中",
      drainTitle: "排空 {node}？", drainText: "不再给 {node} 派发新任务；它已有的任务会继续完成，完成后显示“已排空”。",
      pauseTitle: "暂停向 {node} 派发？", pauseText: "在恢复之前不再给 {node} 派发新任务；它已经在下载的任务不会停下（节点协议没有暂停命令）。",
      resumeTitle: "恢复 {node}？", resumeText: "{node} 重新接收新任务，等待中的任务会立即派发给它。",
      limitTitle: "把 {node} 的下载上限设为 {limit}？", limitText: "站点同一时间最多给 {node} 派发这么多个未完成的任务（协议里没有限速消息，新旧节点都只是少派发）；它已有的任务不受影响。",
      limitInvalid: "上限是 1 到 100,000 的整数，留空表示不限。",
      nodeControlled: "{node}：{what}。",
      diskFromInventory: "上次清点（{at}）的数字", diskFromNode: "节点 {at} 报告的数字", diskBudget: "磁盘预算 {budget}", diskNoBudget: "无磁盘预算",
      connected: "已连接", disconnected: "已断开", connectedAgo: "连接于 {ago}", lastSeen: "最后在线 {ago}",
      none: "无", never: "从未",
      dropStale: "过时", dropOldGeneration: "旧的任务代", dropDuplicate: "重复", dropUnknownTask: "未知任务",
      evArchiveUrl: "下载地址", evArchiveUrlSource: "地址来源", evWarning: "注意",
      stepReserve: "预留", stepSubmit: "提交到上游", stepPersist: "记录上游的答复", stepRecovery: "重启后恢复",
      stepRecreate: "预留（归档不在后重新创建）", stepResolved: "管理员判定为已提交",
      stepResolvedWithoutUrl: "管理员判定为已提交（没有归档链接，无需下载）", stepDeleted: "已删除",
      sourceSubmit: "来自提交的答复", sourceAudit: "来自上游审计", sourceNone: "没有",
      noArchiveUrl: "不知道下载地址（提交的答复和上游审计里都没有）：判为“已提交”会计费，但无法派发给节点。",
      errTimeout: "上游在超时时间内没有答复", errConnection: "连接在收到答复之前断开",
      errServer: "上游返回了服务器错误", errOther: "上游的答复无法确认", errDetail: "技术细节",
      auditCount: "次提交记录在上游的审计里", auditCountOne: "次提交记录在上游的审计里", auditZero: "次提交：上游没有这个 gid 的提交记录", auditLast: "最近一次：{at}",
      auditMissing: "无法取得上游审计",
      actionLabel: "{action}：gid {gid}", actionLabelNamed: "{action}：gid {gid}（{name}）",
      gidInvalid: "gid 必须是 1 到 2147483647 之间的整数。", upstreamTokenMissing: "请填写上游令牌。",
      created: "已创建任务 {gid}：上游已接受，正在等待节点下载。",
      createdUnknown: "任务 {gid} 的提交结果未知：上游没有给出明确答复。系统不会自动重试，也不会重复扣费；管理员核对后会处理。",
      createConflict: "gid {gid} 已经有任务了（可能正在处理，或等待管理员核对），没有重复提交。",
      createRejected: "上游拒绝了 gid {gid}，没有扣费。",
      createQuota: "本周额度不够创建这个任务，没有扣费。",
      createInvalid: "输入有误，请检查后重试。",
      createUnauthorized: "令牌已失效，请重新登录。",
      createUnavailable: "上游暂时不可用，请求没有发出，也没有扣费；可以稍后再试。",
      createFailed: "创建失败（HTTP {code}）。",
      tasksTitle: "任务", refresh: "刷新", noTasks: "还没有任务。", loadMore: "加载更多",
      favorite: "收藏", unfavorite: "取消收藏", delete: "删除", retryDelete: "重试删除",
      deleteTitle: "删除任务？", deleteText: "删除 {name}（gid {gid}）？节点确认删除文件之前，任务会显示为“待删除”。",
      deleteConfirm: "删除", deleteStarted: "已请求删除 {gid}，等待节点确认。", deleted: "任务 {gid} 已删除。",
      deleteFailed: "删除失败（HTTP {code}）：{message}", favoriteFailed: "收藏操作失败（HTTP {code}）：{message}",
      progress: "进度", node: "节点", cost: "费用", created_at: "创建于",
      unknownTitle: "提交未知的操作", noUnknown: "没有需要核对的操作。",
      unknownHint: "上游没有给出明确答复。请根据证据（特别是上游的审计记录）判断它是否真的提交了；两个结论都不会再次请求上游。",
      evStep: "步骤", evAt: "时间", evError: "错误", evAudit: "上游审计", evOperation: "操作 ID",
      wasSubmitted: "确实已提交", wasNotSubmitted: "没有提交",
      resolveSubmittedTitle: "确认“已提交”？", resolveNotSubmittedTitle: "确认“没有提交”？",
      resolveSubmittedText: "gid {gid} 将按已提交处理：计入用量一次，并派发给节点下载。",
      resolveNotSubmittedText: "gid {gid} 将按未提交处理：释放这个任务，gid 可以重新创建。",
      note: "备注", cancel: "取消", confirm: "确认",
      resolved: "gid {gid} 已处理：{verdict}。", resolveConflict: "gid {gid} 已经不是“提交未知”状态，没有改动。",
      resolveFailed: "处理失败（HTTP {code}）：{message}",
      verdictSubmitted: "已提交", verdictNotSubmitted: "没有提交",
      verdictWait: "这次提交是在回收失联站点时判为未知的：{at} 之前，那个站点迟到的请求仍可能到达上游，所以在此之前不能判为“没有提交”（“确实已提交”随时可以）。",
      verdictWaitOver: "等待已结束（自 {at} 起）：现在可以判为“没有提交”。",
      verdictTooEarly: "gid {gid} 现在还不能判为“没有提交”，最早 {at}；没有改动。",
      againstPosts: "上游审计记录了这个 gid 的 {n} 次提交：判为“没有提交”与之矛盾，必须写明理由（备注）。",
      againstPostsAt: "上游审计记录了这个 gid 的 {n} 次提交（最近一次：{at}）：判为“没有提交”与之矛盾，必须写明理由（备注）。",
      againstNoPost: "上游审计没有这个 gid 的提交记录：判为“确实已提交”与之矛盾，必须写明理由（备注）。",
      againstUnavailable: "无法读取上游审计，没有证据能证实这个结论：必须写明理由（备注）。",
      noteRequiredUnavailableText: "没有可读取的证据：上游审计无法读取。请在备注里写明作出这个结论的理由；审计日志会记下备注，并标明证据不可用。",
      noteRequiredText: "这个结论与上游的审计记录矛盾，必须在备注里写明理由；审计日志会记下备注，并标明它与证据矛盾。",
      noteRequired: "gid {gid}：这个结论与上游审计矛盾，必须写备注。",
      noteRequiredUnavailable: "gid {gid}：无法读取上游审计，没有证据证实这个结论，必须写备注。",
      nodesTitle: "节点", noNodes: "最近 7 天没有节点连接过。", nodeId: "节点", protocol: "协议",
      queue: "已分配任务", revision: "修订号", connectedAt: "连接时间", legacy: "旧版 v1", v2: "v2",
      liveOn: "实时更新中", liveOff: "实时连接断开，正在重连……", loadFailed: "加载失败（HTTP {code}）：{message}",
      signedInAs: "已登录",
      whoUser: "{user}", whoSite: "站点 {site}",
      tabQueued: "排队中", queuedOn: "在 {node} 排队，尚未开始", queuedWaiting: "排队等待节点",
      nodeOfflineSince: "{node} 自 {since} 起离线", nodeOffline: "{node} 离线",
      stalledSince: "自 {since} 起没有进展", waitingOffline: "等待 {node}（离线）",
      waitingNode: "等待 {node} 确认删除",
      forceDelete: "强制删除", forceTitle: "强制删除这个任务？",
      forceText: "{node} 离线，无法确认删除 gid {gid}。强制删除会直接把任务标为已删除（节点上的文件可能还在）；审计日志会记下你的备注。",
      forced: "gid {gid} 已强制删除。", forceFailed: "强制删除失败：{message}",
      filterFavorite: "只看收藏", filterNode: "节点", nodeAll: "全部节点",
      orderSize: "按大小（大的在前）", orderProgress: "按进度", orderStatus: "按状态",
      pageSize: "每页", shownOf: "显示 {shown} 个，共 {total} 个", shownOnly: "显示 {shown} 个",
      selectAll: "全选已显示的", selectTask: "选择", selectedN: "已选 {n} 个",
      bulkDelete: "删除所选", bulkRetry: "重试所选", clearSelection: "取消选择",
      bulkDeleteTitle: "删除 {n} 个任务？", bulkDeleteText: "删除所选的 {n} 个任务？节点确认删除文件之前，它们会显示为“待删除”。",
      bulkRetryTitle: "重试 {n} 个任务？", bulkRetryText: "重新请求所选的 {n} 个任务（删除失败的会再次删除）。",
      bulkWorking: "正在处理 {done} / {n}……", bulkDone: "{action}：{ok} 个成功，{failed} 个没有完成。",
      bulkFailedSome: "没有完成的 gid：{list}",
      viewLabel: "视图", viewCards: "卡片", viewTable: "表格", tableColumns: "列",
      colGid: "gid", colName: "名称", colStatus: "状态", colProgress: "进度", colSize: "大小", colSpeed: "速度",
      colNode: "节点", colOwner: "用户", colCost: "费用", colCreated: "创建时间",
      pageFirst: "第一页", pagePrev: "上一页", pageNext: "下一页", pageOf: "第 {page} 页，共 {pages} 页", pageN: "第 {page} 页",
      pageGo: "跳到第", pageGoUnit: "页", pageGoButton: "前往", pageNumbersLabel: "页码",
      pagerLabel: "分页",
      selectMatching: "选择全部 {n} 个符合条件的任务", matchingSelected: "已选全部 {n} 个符合条件的任务",
      matchingTooMany: "一次最多处理 {max} 个任务，现在有 {n} 个符合条件：请缩小筛选范围。",
      bulkRetryN: "重试删除（{n}）", bulkRetryOnly: "所选任务中有 {n} 个删除失败，会再次删除。其余 {skip} 个不受影响（重试只适用于删除失败的任务）。",
      bulkMatchingDeleteText: "删除符合当前筛选和搜索的全部 {n} 个任务？节点确认删除文件之前，它们会显示为“待删除”。",
      bulkMatchingRetryText: "符合当前筛选和搜索的 {n} 个任务中有 {r} 个删除失败，会再次删除。其他任务不受影响。",
      bulkMatchingWorking: "正在处理符合条件的 {n} 个任务……",
      matchingCountChanged: "什么也没有做：现在有 {n} 个任务符合条件，而不是 {m} 个。请检查列表后再确认一次。",
      bulkResultTitle: "{action}：{ok} 个成功，{failed} 个没有完成，{skipped} 个不适用。",
      bulkReasonConflict: "{n} 个状态不允许此操作", bulkReasonGone: "{n} 个已不存在", bulkReasonBusy: "{n} 个因网站繁忙未完成，请重试",
      bulkReasonOther: "{n} 个被拒绝", bulkReasonNoRetry: "{n} 个不是删除失败的任务，重试不适用", bulkResultGids: "gid：{list}",
      bulkResultDismiss: "关闭",
      costUnits: "{n} 点", gidHint: "gid：上游图库的编号（1 到 2147483647 的整数，可以用全角数字）。",
      upstreamTokenHint: "上游令牌：上游网站给你的令牌，站点提交时代为转交。",
      creatingSlowN: "上游答复很慢。站点最多等到它的超时时间（{n} 秒）；仍没有明确答复时，任务会标为“提交未知”，不会重复提交或扣费。",
      chartEmpty: "{window}没有下载。", chartUsageEmpty: "最近 8 周还没有用量。",
      axisUnits: "点",
      createQuotaN: "本周额度不够创建这个任务，没有扣费：这个任务需要 {cost}，本周已用 {used} 点 / 额度 {quota} 点。",
      createQuotaUsage: "本周额度不够创建这个任务，没有扣费：本周已用 {used} 点 / 额度 {quota} 点。",
      createUnavailableN: "上游在 {n} 秒内没有答复，请求没有发出，也没有扣费；可以稍后再试。",
      createRateLimited: "创建得太快了，请稍等 {n} 秒再试。", createRateLimitedNoN: "创建得太快了，请稍后再试。",
      createNotFound: "上游没有 gid {gid} 的图库，没有扣费。",
      errUnauthorized: "登录已失效，请重新登录。", errForbidden: "只有管理员可以这样做。",
      errNotFound: "没有找到这个任务。", errConflict: "任务的状态已经变了，没有改动。",
      errInvalid: "请求有误。", errRateLimited: "操作太频繁，请稍后再试。",
      errUnavailable: "站点暂时忙不过来（数据库忙或不可用），没有改动；请稍后再试。",
      errInternal: "站点内部出错，没有改动；请稍后再试。", errTooLarge: "请求太大。",
      errUpstream: "上游暂时不可用，请稍后再试。", errGeneric: "操作没有完成（HTTP {code}）。",
      detailRetrying: "{n}后重试：{reason}", detailRetryingNoReason: "{n}后重试",
      detailRetryingSoon: "马上重试：{reason}", detailRetryingSoonNoReason: "马上重试",
      reasonRefused: "上游无法访问（连接被拒绝）", reasonTimeout: "超时", reasonUnreachable: "上游无法访问",
      reasonDiskFull: "磁盘已满", reasonReset: "连接中断", reasonDns: "找不到主机", reasonHttp: "上游返回了错误 {code}",
      reasonOther: "节点报告了问题",
      liveNodesOffline: "{nodes} 离线", liveManyOffline: "{n} 个节点离线",
      waitingOfflineSince: "等待 {node}（自 {since} 起离线）",
      createdMoved: "已创建任务 {gid}。",
      createQuotaUnsettled: "本周额度不够创建这个任务，没有扣费：这个任务需要 {cost}，本周已用 {used} 点 / 额度 {quota} 点，另有 {unsettled} 点属于结果未定的提交（也计入额度）。",
      download: "下载", details: "详情", archiveSize: "归档大小", archiveSha256: "SHA-256", archiveNode: "节点",
      archiveSizeValue: "{human}（{bytes} 字节）", notReported: "未报告",
      archiveGoneFact: "归档", archiveGoneValue: "已不在节点上：{reason}（{at}）",
      copy: "复制", copySha: "复制 SHA-256", copied: "已复制", copyFailed: "无法复制：请选中后手动复制。",
      downloadStarted: "gid {gid} 的下载已开始：浏览器会保存文件。",
      archiveNotReady: "尚未完成：gid {gid} 的归档还没有准备好。",
      archiveGone: "gid {gid} 的归档已不在节点上：{reason}。", archiveGoneNoReason: "gid {gid} 的归档已不在节点上。",
      archiveNodeOffline: "保存 gid {gid} 归档的节点离线；请在 {n}后重试。", archiveNodeOfflineNoN: "保存 gid {gid} 归档的节点离线；请稍后再试。",
      archiveNotServed: "保存 gid {gid} 归档的节点不提供归档下载。",
      archiveTooMany: "你经站点同时进行的下载太多了：等其中一个结束后再试。",
      goneExpired: "超过了保留期限", goneDiskBudget: "为腾出磁盘空间被删除", goneCorrupt: "文件已损坏",
      goneMissing: "节点上找不到了", goneCancelled: "已取消", goneRetired: "节点已退役",
      goneNote: "归档已失效：{reason}（{at}）", fetchAgain: "重新获取",
      fetchAgainHint: "已填好 gid {gid}：输入上游令牌后点“创建”。重新获取是一次新的扣费，创建前会先请你确认。",
      chargeTitle: "重新获取要再扣费", chargeText: "gid {gid} 的归档已不在任何节点上。重新获取会再向上游提交一次，扣费 {cost}（上次的费用；以上游这次的报价为准），计入本周额度。",
      chargeConfirm: "确认扣费并获取", chargeDeclined: "没有重新获取 gid {gid}，没有扣费。",
      createAlreadyCompleted: "gid {gid} 已经下载完成，归档还在：直接下载即可，没有重复提交，也没有扣费。",
      bulkLinks: "aria2 下载链接", linksWorking: "正在生成链接……",
      linksNone: "所选的任务都还没有完成：没有可以生成的链接。",
      linksSaved: "已保存 tasknet-links.txt（{n} 个链接）。", linksSavedOne: "已保存 tasknet-links.txt（1 个链接）。",
      linksSkipped: "跳过（未完成）：{n} 个。", linksMissing: "现在无法取得（节点离线或归档已不在）：{n} 个。",
      linksHint: "用 aria2c -i tasknet-links.txt 下载并校验每个归档；链接会过期（默认 10 分钟），请尽快使用。",
      linksFailed: "没有生成链接：{message}",
      linksViaSite: "经站点下载的链接：{n} 个，aria2c 需要你的 API 令牌：{command}",
      linksViaSiteCommand: "aria2c -i tasknet-links.txt --header=\"Authorization: Bearer 你的令牌\""
    },
    en: {
      taskOpen: "History and details", taskTitle: "Task {gid}", taskBack: "Back to tasks", taskLoading: "Loading…",
      taskOwner: "Owner", taskNode: "Node", taskOperationId: "Generation (operationId)", taskDeleteOperationId: "Delete operation (deleteOperationId)",
      taskCost: "Cost", taskCostPoints: "{cost} cost units", taskMetered: "counted in {week}", taskNotMetered: "not charged",
      taskStep: "Last step reached", taskError: "Why it became unknown", taskUnknownAt: "Unknown since", taskCreatedAt: "Created", taskUpdatedAt: "Last changed",
      taskArchiveGone: "Archive gone: {reason} ({at}, node {node})", taskDeleteReason: "Why the delete failed",
      historyTitle: "History", historyEmpty: "No recorded changes.", historyOnNode: "node {node}",
      historyVerdict: "{actor} reconciled it: {verdict}", verdictSubmitted: "submitted", verdictNotSubmitted: "not submitted",
      historyForceDelete: "{actor} force-deleted it (node {node})", historyNote: "Note: {note}",
      historyCreated: "Created", historyCreatedCost: "Created ({cost} cost units)", historyTruncated: "Only the newest 2,000 recorded changes are shown.",
      evidenceTitle: "The upstream's evidence (the last verdict was taken on)", taskReconcile: "Reconcile this task", taskNotFound: "No such task (or not yours).",
      skip: "Skip to content", signOut: "Sign out", navTasks: "Tasks", navAdmin: "Admin",
      signInTitle: "Sign in", tokenLabel: "API token", signIn: "Sign in",
      tokenHint: "An admin makes tokens (Admin → Users, or tasknet-admin user add).",
      tokenMissing: "Enter a token.", tokenRejected: "That token was not accepted. Check it and try again.",
      firstAdminHint: "The first admin is made on the site's host: tasknet-admin --db SITE_DB user add NAME --admin (it prints the token).",
      demoHint: "This is a demo site (--demo): the token is demo.",
      accountDisabled: "This account has been disabled by an admin: ask an admin to enable it again.",
      usersTitle: "Users", userName: "Name", userRole: "Role", roleAdmin: "Admin", roleUser: "User",
      userQuota: "Weekly quota (cost units)", userState: "State", userEnabled: "Enabled", userDisabledSince: "Disabled since {at}",
      userSessions: "Sessions", userCreated: "Created", userActions: "Actions", userYou: "{name} (you)",
      userAdd: "Add user", userAdminBox: "Admin (sees every task, manages nodes and users)", userQuotaDefault: "Empty: the site's default",
      userSaveQuota: "Save quota", userDisable: "Disable", userEnable: "Enable", userRotate: "New token", userEndSessions: "End sessions",
      userDisableTitle: "Disable {name}?", userDisableText: "{name}'s token and every browser session stop working at once; its tasks stay and go on. You can enable it again later.",
      userRotateTitle: "Give {name} a new token?", userRotateText: "The old token and every browser session of {name} stop working at once. The new token is shown this once.",
      userEndTitle: "End every session of {name}?", userEndText: "{name}'s browsers must sign in again; the token still works.",
      userAdded: "User {name} added.", userTokenShown: "{name}'s token (shown this once: copy it now and hand it over safely):",
      userDisabledDone: "{name} is disabled ({n} sessions ended).", userEnabledDone: "{name} is enabled again.",
      userQuotaSaved: "{name}'s weekly quota is now {quota} cost units.", userSessionsEnded: "{n} sessions of {name} ended.",
      userNameInvalid: "A name is 1 to 64 letters, digits, “_”, “.” or “-”.", userQuotaInvalid: "A quota is a whole number from 0 to 1,000,000,000.",
      userExists: "There is already a user named {name}.", userSelf: "You cannot disable your own account.", userActionFailed: "Not done: {message}", userRotated: "{name} has a new token (below).",
      upstreamDownCreate: "The upstream is not answering (a create just now could not reach it): new tasks cannot be submitted until it is back; nothing was charged.",
      upstreamDownDownloads: "The upstream is not answering: {n} downloads cannot reach it and retry by themselves.",
      upstreamDownDownloadsOne: "The upstream is not answering: 1 download cannot reach it and retries by itself.",
      speedNotYet: "not measured yet (waiting for the node's next report)", speedLegacy: "not reported by this legacy node (progress only)",
      cannotReach: "The site is not reachable. Check your connection and try again.",
      usageTitle: "This week's usage", usageText: "{week}: used {used} of {quota} cost units ({left} left)",
      createTitle: "New task", upstreamToken: "Upstream token", nameOptional: "Name (optional)", create: "Create",
      creating: "Submitting…",
      navLabel: "Sections", navCharts: "Charts",
      creatingPhase: "Submitting to upstream… {n}",
      creatingSlow: "The upstream is slow to answer. The site waits up to its timeout; without a clear answer by then the task is marked “Submission unknown”, and it is never resubmitted or charged twice.",
      createConflictOwn: "You already have a task for gid {gid} ({status}). Nothing was resubmitted.",
      createConflictAdmin: "gid {gid} already has a task ({status}, owner {owner}). Nothing was resubmitted.",
      createConflictOther: "gid {gid} is taken by another user: a gid can have only one task. Try another gid.",
      filterStatus: "Filter by status", tabAll: "All", tabActive: "In progress", tabCompleted: "Completed", tabAttention: "Needs attention",
      search: "Search", searchHint: "Name or part of a gid", order: "Order",
      orderNewest: "Newest first", orderOldest: "Oldest first", orderGid: "By gid",
      staleBanner: "Live updates are disconnected: progress and speed below may be out of date.", staleMark: "stale", noMatch: "No task matches.",
      size: "Size", downloaded: "Downloaded", speed: "Speed", eta: "Time left", owner: "Owner", completedAt: "Completed",
      bytesOf: "{done} of {size}",
      chartsTitle: "Charts", chartsHint: "One point per minute (over 6 or 24 hours: per 15 minutes).", chartsWindow: "Period",
      window15m: "last 15 minutes", window1h: "last hour", window6h: "last 6 hours", window24h: "last 24 hours",
      option15m: "Last 15 minutes", option1h: "Last hour", option6h: "Last 6 hours", option24h: "Last 24 hours",
      chartThroughput: "Download speed", chartNodes: "Downloaded per node", chartUsage: "Weekly usage against quota",
      chartThroughputLabel: "Download speed in the {window}: {bytes} in all, peak {peak} (the average over {bucket}), {completed} tasks completed.",
      bucketMinute: "1 minute", bucketMinutes: "{n} minutes",
      chartNodesEmpty: "No node downloaded anything in the {window}.", chartNodesLabel: "Downloaded per node in the {window}: {list}.", chartOtherNodes: "{n} other nodes",
      chartUsageLabel: "Usage over the last 8 weeks, in cost units; this week {used} of {quota}.", quotaLine: "quota {quota} cost units",
      nodeState: "State", activeTasks: "Tasks", nodeSpeed: "Speed", nodeSite: "Site", runningQueued: "{running} running, {queued} queued", lastReport: "Last report",
      droppedEntries: "Dropped reports", connectedSince: "Connected / last seen",
      nodeArchives: "Archives", nodeBytesHeld: "Held", nodeFree: "Free space",
      nodeActions: "Actions", reassignNode: "Reassign tasks", retireNode: "Retire",
      reassignTitle: "Reassign the unfinished tasks of {node}?",
      reassignText: "The unfinished tasks of {node} go to other connected nodes now (or wait for one), with the same operation ids: nothing is submitted or charged again upstream, only the download repeats. {node} is told to cancel them when it returns. The audit log keeps your note.",
      retireTitle: "Retire {node}?",
      retireText: "{node} is gone for good: its unfinished tasks go to other nodes, the archives of its completed tasks are marked gone (node retired), its key is removed so it can no longer log in, and its connection is closed. The audit log keeps your note.",
      reassigned: "{n} task(s) moved off {node} ({sent} sent to other nodes, {waiting} waiting for a node).",
      retired: "{node} retired: {n} task(s) moved, {archives} archive(s) marked gone.",
      nodeActionFailed: "The action failed: {message}",
      heldTasks: "{n} held (offline, not downloading)",
      drainNode: "Drain", pauseNode: "Pause", resumeNode: "Resume", nodeLimit: "Download limit", setLimit: "Set",
      noLimit: "no limit", limitShown: "limit {n}", modeDraining: "draining, {n} left", modeDrained: "drained",
      modePaused: "paused", modeActive: "takes new tasks", modeDrainingShort: "draining",
      drainTitle: "Drain {node}?", drainText: "{node} gets no new task; what it holds finishes, and then it shows as drained.",
      pauseTitle: "Pause dispatch to {node}?", pauseText: "{node} gets no new task until it is resumed; downloads it already runs go on (the node protocol has no pause command).",
      resumeTitle: "Resume {node}?", resumeText: "{node} takes new tasks again; waiting tasks go to it at once.",
      limitTitle: "Set the download limit of {node} to {limit}?", limitText: "The site gives {node} at most this many unfinished tasks at a time (the protocol has no limit message, so new and legacy nodes alike are simply dispatched less); tasks it already holds stay.",
      limitInvalid: "A limit is a whole number from 1 to 100,000; leave it empty for no limit.",
      nodeControlled: "{node}: {what}.",
      diskFromInventory: "As its last inventory counted them ({at})", diskFromNode: "As the node said at {at}", diskBudget: "disk budget {budget}", diskNoBudget: "no disk budget",
      connected: "Connected", disconnected: "Disconnected", connectedAgo: "connected {ago}", lastSeen: "last seen {ago}",
      none: "none", never: "never",
      dropStale: "stale", dropOldGeneration: "old generation", dropDuplicate: "duplicate", dropUnknownTask: "unknown task",
      evArchiveUrl: "Archive URL", evArchiveUrlSource: "URL from", evWarning: "Note",
      stepReserve: "reserve", stepSubmit: "submit to upstream", stepPersist: "record the upstream's answer", stepRecovery: "recovery after a restart",
      stepRecreate: "reserve (created again after its archive was gone)", stepResolved: "judged submitted by an admin",
      stepResolvedWithoutUrl: "judged submitted by an admin (no archive link: nothing to download)", stepDeleted: "deleted",
      sourceSubmit: "the submit answer", sourceAudit: "the upstream's audit", sourceNone: "none",
      noArchiveUrl: "No archive URL is known (neither from the submit answer nor from the upstream's audit): “submitted” would charge the task but no node can download it.",
      errTimeout: "the upstream did not answer within the timeout", errConnection: "the connection closed before an answer",
      errServer: "the upstream answered with a server error", errOther: "the upstream's answer could not be confirmed", errDetail: "Technical detail",
      auditCount: "submissions recorded by the upstream", auditCountOne: "submission recorded by the upstream", auditZero: "submissions: the upstream has no record of this gid", auditLast: "last: {at}",
      auditMissing: "Upstream audit unavailable",
      actionLabel: "{action}: gid {gid}", actionLabelNamed: "{action}: gid {gid} ({name})",
      gidInvalid: "gid must be a whole number from 1 to 2147483647.", upstreamTokenMissing: "Enter the upstream token.",
      created: "Task {gid} created: the upstream accepted it; waiting for a node to download it.",
      createdUnknown: "Task {gid}: the submission outcome is unknown (the upstream gave no clear answer). It will not be retried or charged twice; an admin will reconcile it.",
      createConflict: "gid {gid} already has a task (in progress, or waiting for an admin to reconcile). Nothing was resubmitted.",
      createRejected: "The upstream refused gid {gid}; nothing was charged.",
      createQuota: "Not enough quota left this week for this task; nothing was charged.",
      createInvalid: "Please check the input and try again.",
      createUnauthorized: "Your token is no longer valid. Please sign in again.",
      createUnavailable: "The upstream is unavailable; nothing was sent and nothing charged. Try again later.",
      createFailed: "Create failed (HTTP {code}).",
      tasksTitle: "Tasks", refresh: "Refresh", noTasks: "No tasks yet.", loadMore: "Load more",
      favorite: "Favorite", unfavorite: "Remove favorite", delete: "Delete", retryDelete: "Retry delete",
      deleteTitle: "Delete this task?", deleteText: "Delete {name} (gid {gid})? Until the node confirms the files are gone the task shows “Delete pending”.",
      deleteConfirm: "Delete", deleteStarted: "Delete of {gid} requested; waiting for the node to confirm.", deleted: "Task {gid} deleted.",
      deleteFailed: "Delete failed (HTTP {code}): {message}", favoriteFailed: "Favorite failed (HTTP {code}): {message}",
      progress: "Progress", node: "Node", cost: "Cost", created_at: "Created",
      unknownTitle: "Operations with unknown outcome", noUnknown: "Nothing to reconcile.",
      unknownHint: "The upstream gave no clear answer. Judge from the evidence (above all the upstream's audit record) whether it was really submitted; neither verdict calls the upstream again.",
      evStep: "Step", evAt: "Time", evError: "Error", evAudit: "Upstream audit", evOperation: "Operation ID",
      wasSubmitted: "It was submitted", wasNotSubmitted: "It was not submitted",
      resolveSubmittedTitle: "Mark as submitted?", resolveNotSubmittedTitle: "Mark as not submitted?",
      resolveSubmittedText: "gid {gid} will count as submitted: metered once and dispatched to a node.",
      resolveNotSubmittedText: "gid {gid} will count as not submitted: the task is released and the gid can be created again.",
      note: "Note", cancel: "Cancel", confirm: "Confirm",
      resolved: "gid {gid} resolved: {verdict}.", resolveConflict: "gid {gid} is no longer unknown; nothing changed.",
      resolveFailed: "Resolve failed (HTTP {code}): {message}",
      verdictSubmitted: "submitted", verdictNotSubmitted: "not submitted",
      verdictWait: "This submission was settled as unknown when a gone site was reaped: until {at} that site's late request could still reach the upstream, so “not submitted” is possible only from then (“submitted” is possible now).",
      verdictWaitOver: "The wait is over (since {at}): “not submitted” is possible now.",
      verdictTooEarly: "gid {gid} cannot be marked not submitted before {at}; nothing changed.",
      againstPosts: "The upstream's audit records {n} submission(s) for this gid: “It was not submitted” contradicts it and needs a note saying why.",
      againstPostsAt: "The upstream's audit records {n} submission(s) for this gid (last: {at}): “It was not submitted” contradicts it and needs a note saying why.",
      againstNoPost: "The upstream's audit records no submission for this gid: “It was submitted” contradicts it and needs a note saying why.",
      againstUnavailable: "The upstream's audit could not be read, so nothing confirms this verdict: a note saying why is required.",
      noteRequiredUnavailableText: "No readable evidence: the upstream's audit could not be read. Say in the note why you take this verdict; the audit log keeps the note and marks the evidence as unavailable.",
      noteRequiredText: "This verdict contradicts the upstream's audit record: say why in the note. The audit log keeps the note and marks the verdict as contradicting the evidence.",
      noteRequired: "gid {gid}: this verdict contradicts the upstream's audit and needs a note.",
      noteRequiredUnavailable: "gid {gid}: the upstream's audit could not be read, so nothing confirms this verdict; it needs a note.",
      nodesTitle: "Nodes", noNodes: "No node was connected in the last 7 days.", nodeId: "Node", protocol: "Protocol",
      queue: "Assigned", revision: "Revision", connectedAt: "Connected", legacy: "legacy v1", v2: "v2",
      liveOn: "Live", liveOff: "Live updates disconnected; reconnecting…", loadFailed: "Loading failed (HTTP {code}): {message}",
      signedInAs: "Signed in",
      whoUser: "{user}", whoSite: "site {site}",
      tabQueued: "Queued", queuedOn: "queued on {node}, not started", queuedWaiting: "queued, waiting for a node",
      nodeOfflineSince: "{node} offline since {since}", nodeOffline: "{node} offline",
      stalledSince: "no progress since {since}", waitingOffline: "waiting for {node} (offline)",
      waitingNode: "waiting for {node} to confirm the delete",
      forceDelete: "Force delete", forceTitle: "Force-delete this task?",
      forceText: "{node} is offline and cannot confirm the delete of gid {gid}. Force delete marks the task deleted now (its files may still be on the node); the audit log keeps your note.",
      forced: "gid {gid} force-deleted.", forceFailed: "Force delete failed: {message}",
      filterFavorite: "Favourites only", filterNode: "Node", nodeAll: "All nodes",
      orderSize: "By size (largest first)", orderProgress: "By progress", orderStatus: "By status",
      pageSize: "Per page", shownOf: "{shown} of {total}", shownOnly: "{shown} shown",
      selectAll: "Select all shown", selectTask: "Select", selectedN: "{n} selected",
      bulkDelete: "Delete selected", bulkRetry: "Retry selected", clearSelection: "Clear selection",
      bulkDeleteTitle: "Delete {n} tasks?", bulkDeleteText: "Delete the {n} selected tasks? Until their nodes confirm the files are gone they show “Delete pending”.",
      bulkRetryTitle: "Retry {n} tasks?", bulkRetryText: "Retry the {n} selected tasks (a failed delete is tried again).",
      bulkWorking: "Working… {done} of {n}", bulkDone: "{action}: {ok} done, {failed} not done.",
      bulkFailedSome: "Not done: gid {list}",
      viewLabel: "View", viewCards: "Cards", viewTable: "Table", tableColumns: "Columns",
      colGid: "gid", colName: "Name", colStatus: "Status", colProgress: "Progress", colSize: "Size", colSpeed: "Speed",
      colNode: "Node", colOwner: "Owner", colCost: "Cost", colCreated: "Created",
      pageFirst: "First", pagePrev: "Previous", pageNext: "Next", pageOf: "Page {page} of {pages}", pageN: "Page {page}",
      pageGo: "Go to page", pageGoUnit: "", pageGoButton: "Go", pageNumbersLabel: "Page numbers",
      pagerLabel: "Pages",
      selectMatching: "Select all {n} matching", matchingSelected: "All {n} matching selected",
      matchingTooMany: "At most {max} tasks at once and {n} match: narrow the filter.",
      bulkRetryN: "Retry delete ({n})", bulkRetryOnly: "{n} of the selected tasks are failed deletes: their delete is tried again. The other {skip} are left as they are (retry only applies to a failed delete).",
      bulkMatchingDeleteText: "Delete all {n} tasks matching the current filter and search? Until their nodes confirm the files are gone they show “Delete pending”.",
      bulkMatchingRetryText: "{r} of the {n} tasks matching the current filter and search are failed deletes: their delete is tried again. Other tasks are left as they are.",
      bulkMatchingWorking: "Working on the {n} matching tasks…",
      matchingCountChanged: "Nothing was done: {n} tasks match now, not {m}. Check the list and confirm again.",
      bulkResultTitle: "{action}: {ok} done, {failed} not done, {skipped} not applicable.",
      bulkReasonConflict: "{n} not in a state that allows it", bulkReasonGone: "{n} no longer exist", bulkReasonBusy: "{n} not done because the site was busy: try again",
      bulkReasonOther: "{n} refused", bulkReasonNoRetry: "{n} are not failed deletes: retry does not apply", bulkResultGids: "gid {list}",
      bulkResultDismiss: "Dismiss",
      costUnits: "{n} cost units", gidHint: "gid: the gallery's number at the upstream (a whole number from 1 to 2147483647; full-width digits are fine).",
      upstreamTokenHint: "Upstream token: the token the upstream site gave you; the site passes it on when it submits.",
      creatingSlowN: "The upstream is slow to answer. The site waits up to its timeout ({n} s); without a clear answer by then the task is marked “Submission unknown”, and it is never resubmitted or charged twice.",
      chartEmpty: "Nothing was downloaded in the {window}.", chartUsageEmpty: "No usage in the last 8 weeks yet.",
      axisUnits: "cost units",
      createQuotaN: "Not enough quota left this week for this task; nothing was charged: it costs {cost}, and this week {used} of {quota} cost units are used.",
      createQuotaUsage: "Not enough quota left this week for this task; nothing was charged: this week {used} of {quota} cost units are used.",
      createUnavailableN: "The upstream did not answer within {n} s; nothing was sent and nothing charged. Try again later.",
      createRateLimited: "Too many creates in a row: wait {n} s and try again.", createRateLimitedNoN: "Too many creates in a row: wait a moment and try again.",
      createNotFound: "The upstream has no gallery {gid}; nothing was charged.",
      errUnauthorized: "Your session has ended. Please sign in again.", errForbidden: "Only an admin can do that.",
      errNotFound: "That task was not found.", errConflict: "The task's state changed meanwhile; nothing changed.",
      errInvalid: "The request was not accepted.", errRateLimited: "Too many requests: try again in a moment.",
      errUnavailable: "The site cannot act right now (its database is busy or unreachable); nothing changed. Try again shortly.",
      errInternal: "The site had an internal error; nothing changed. Try again shortly.", errTooLarge: "The request is too large.",
      errUpstream: "The upstream is unavailable; try again later.", errGeneric: "That did not work (HTTP {code}).",
      detailRetrying: "retrying in {n}: {reason}", detailRetryingNoReason: "retrying in {n}",
      detailRetryingSoon: "retrying in a moment: {reason}", detailRetryingSoonNoReason: "retrying in a moment",
      reasonRefused: "upstream unreachable (connection refused)", reasonTimeout: "timed out", reasonUnreachable: "upstream unreachable",
      reasonDiskFull: "disk full", reasonReset: "connection lost", reasonDns: "host not found", reasonHttp: "the upstream answered {code}",
      reasonOther: "the node reported a problem",
      liveNodesOffline: "{nodes} offline", liveManyOffline: "{n} nodes offline",
      waitingOfflineSince: "waiting for {node} (offline since {since})",
      createdMoved: "Task {gid} created.",
      createQuotaUnsettled: "Not enough quota left this week for this task; nothing was charged: it costs {cost}; this week {used} of {quota} cost units are used, and {unsettled} more are held by submissions whose outcome is not settled yet (they count too).",
      download: "Download", details: "Details", archiveSize: "Size on disk", archiveSha256: "SHA-256", archiveNode: "Node",
      archiveSizeValue: "{human} ({bytes} bytes)", notReported: "not reported",
      archiveGoneFact: "Archive", archiveGoneValue: "no longer held: {reason} ({at})",
      copy: "Copy", copySha: "Copy SHA-256", copied: "Copied", copyFailed: "Could not copy: select it and copy it by hand.",
      downloadStarted: "The download of gid {gid} has started: your browser saves the file.",
      archiveNotReady: "Not complete yet: the archive of gid {gid} is not ready.",
      archiveGone: "The archive of gid {gid} is no longer held: {reason}.", archiveGoneNoReason: "The archive of gid {gid} is no longer held.",
      archiveNodeOffline: "The node holding the archive of gid {gid} is offline; try again in {n}.", archiveNodeOfflineNoN: "The node holding the archive of gid {gid} is offline; try again later.",
      archiveNotServed: "The node holding the archive of gid {gid} does not serve archives.",
      archiveTooMany: "You have too many downloads through the site at once: wait for one to finish and try again.",
      goneExpired: "kept past its retention time", goneDiskBudget: "removed to free disk space", goneCorrupt: "its file was damaged",
      goneMissing: "missing from its node", goneCancelled: "cancelled", goneRetired: "its node was retired",
      goneNote: "Archive gone: {reason} ({at})", fetchAgain: "Get it again",
      fetchAgainHint: "gid {gid} is filled in: enter the upstream token and press Create. Getting it again is a new charge; you will be asked to confirm it first.",
      chargeTitle: "Getting it again is a new charge", chargeText: "No node holds the archive of gid {gid} any more. Getting it again submits it to the upstream once more and charges {cost} (what it cost last time; the upstream's price now decides), counted in this week's quota.",
      chargeConfirm: "Accept the charge and get it", chargeDeclined: "gid {gid} was not fetched again; nothing was charged.",
      createAlreadyCompleted: "gid {gid} is already complete and its archive is held: download it. Nothing was resubmitted or charged.",
      bulkLinks: "Links for aria2", linksWorking: "Making links…",
      linksNone: "None of the selected tasks is complete: there are no links to make.",
      linksSaved: "Saved tasknet-links.txt ({n} links).", linksSavedOne: "Saved tasknet-links.txt (1 link).",
      linksSkipped: "Skipped (not complete): {n}.", linksMissing: "Not available now (node offline or archive gone): {n}.",
      linksHint: "Fetch and verify every archive with aria2c -i tasknet-links.txt; the links expire (after 10 minutes by default), so use it soon.",
      linksFailed: "No links were made: {message}",
      linksViaSite: "Links that go through the site: {n}. For them aria2c needs your API token: {command}",
      linksViaSiteCommand: "aria2c -i tasknet-links.txt --header=\"Authorization: Bearer YOUR_TOKEN\""
    }
  };

  var state = {
    signedIn: false,       // the session cookie (HttpOnly: never read here) was accepted
    lang: "zh",
    tasks: new Map(),      // gid -> task object as the API sends it
    order: [],             // gids, newest first, as listed
    favorites: new Set(),
    next: null,
    // The list's view: a status tab, a search text and an order (kept in the URL hash).
    view: "tasks",
    filter: "all",
    query: "",
    orderBy: "newest",
    listSeq: 0,            // a change of the view: answers of the old view's loads are dropped
    listWant: { refresh: false, more: false },  // loads asked for while one is out
    listBusy: null,        // the list load that is out (a promise)
    pushSeq: 0,            // counts upserts; pushedAt: gid -> pushSeq of its last upsert
    pushedAt: new Map(),
    nodeUp: new Map(),     // node id -> connected (true/false), as the rows and the node panel say
    nodeSince: new Map(),  // node id -> when it went offline (ISO), as far as this page knows
    counts: null,
    countsTimer: null,
    // gid -> operationId of a task this page saw go away: a late push of that
    // same generation must not bring the row back.
    gone: new Map(),
    noticeTimer: null,
    createTimer: null,
    chartsTimer: null,
    stats: null,
    nodes: [],
    isAdmin: false,
    socket: null,
    backoff: 500,
    reconnectTimer: null,
    pollTimer: null,
    unknownTimer: null,
    unknownShown: null,   // what the UNKNOWN list last showed (renderUnknown)
    verdictTimer: null,    // re-reads the UNKNOWN list when a verdict wait ends
    nodesTimer: null,
    favoriteOnly: false,   // #tasks?fav=1
    nodeFilter: "",        // #tasks?node=ID
    pageSize: PAGE_SIZE,   // #tasks?size=N
    selected: new Set(),   // gids ticked for a bulk action
    selectMatching: false, // "Select all N matching": the bulk action acts on the whole view
    matchingRetryable: null, // the failed deletes among the whole view (the API's count), once read
    bulkResult: null,      // the last bulk action's outcome (renderBulkResult)
    tableView: false,      // the dense table instead of the cards (localStorage)
    pageStarts: [],        // the table's pages: how each page before this one was read (pageAt), for Previous
    pageAt: null,          // how the table's page is read: null (the first), {after: cursor} or {page: n}
    pageNumber: 1,         // the table's page number
    wantedPage: 1,         // the page the address asks for (#tasks?page=N)
    upstream: null,        // GET /api/upstream's last answer (the banner)
    total: null,           // tasks matching the view (the list answer's total)
    me: null,              // /api/me: {name, admin}, site
    site: null,
    wantedView: "tasks",   // the view the hash asks for (admin is known only after /api/me)
    usageTimer: null,
    reachTimer: null,
    knownNodes: new Set(),
    detailsOpen: new Set(),  // gids whose details are open (kept across re-renders)
    archiveBusy: new Set(),  // gids whose Download is asking for a link
    linksResult: null,       // the last "Links for aria2" outcome (renderLinksResult)
    archiveNotes: new Map()  // gid -> why its last Download did not start (shown on the row)
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

  var F = window.TasknetFormat;

  function formatTime(value) { return F.date(value, state.lang); }

  // A notice lasts until the next action (see init) or a few seconds.
  function notify(text, isError, kind) {
    var box = $("notice");
    if (!kind && text && text === t("cannotReach")) { kind = "reach"; }
    box.setAttribute("data-kind", kind || "");
    if (kind === "reach") { watchReach(); }
    box.textContent = text || "";
    box.classList.toggle("error", !!isError);
    if (state.noticeTimer) { clearTimeout(state.noticeTimer); state.noticeTimer = null; }
    if (text) {
      state.noticeTimer = setTimeout(function () { state.noticeTimer = null; notify(""); }, isError ? 12000 : 6000);
    }
  }

  // "Delete: gid 207 (name)": every per-task button is told apart by its gid.
  function actionLabel(action, task) {
    return task.name ? t("actionLabelNamed", { action: action, gid: task.gid, name: task.name })
      : t("actionLabel", { action: action, gid: task.gid });
  }

  // Status 0 is a fetch that never got an answer: the site is not reachable.
  function failureText(key, result) {
    if (result.status === 0) { return t("cannotReach"); }
    return errorSentence(result);
  }

  // An error answer in the reader's language: the code's sentence; the
  // site's own (English) message only when the code has none.
  var ERROR_KEYS = {
    unauthorized: "errUnauthorized", forbidden: "errForbidden", not_found: "errNotFound",
    conflict: "errConflict", rate_limited: "errRateLimited", unavailable: "errUnavailable",
    internal: "errInternal", payload_too_large: "errTooLarge", upstream_unavailable: "errUpstream",
    request_timeout: "errInternal", account_disabled: "accountDisabled"
  };
  function errorSentence(result) {
    if (result.status === 0) { return t("cannotReach"); }
    var code = errorCode(result);
    if (code && ERROR_KEYS[code]) { return t(ERROR_KEYS[code]); }
    var text = t(code === "invalid_request" ? "errInvalid" : "errGeneric", { code: result.status });
    var message = errorMessage(result);
    return message ? text + " (" + message + ")" : text;
  }

  // "The site is not reachable" stays only while it is true: ask /healthz
  // every 3 s and clear the notice at the first answer.
  // The create form's answer says so too when a create got no answer.
  function unreachableShown() {
    return $("notice").getAttribute("data-kind") === "reach" || $("create-result").getAttribute("data-outcome") === "0";
  }
  function siteAnswered() {
    if ($("notice").getAttribute("data-kind") === "reach") { notify(""); }
    if ($("create-result").getAttribute("data-outcome") === "0" && !state.createTimer) { clearCreateResult(); }
  }
  function watchReach() {
    if (state.reachTimer) { return; }
    state.reachTimer = setInterval(function () {
      if (!unreachableShown()) { clearInterval(state.reachTimer); state.reachTimer = null; return; }
      fetch("/healthz", { cache: "no-store" }).then(function (r) { if (r.status < 500 || r.status === 503) { siteAnswered(); } }, function () {});
    }, 3000);
  }

  // ---- HTTP ---------------------------------------------------------------

  function api(method, path, body) {
    var headers = { "Accept": "application/json" };
    var init = { method: method, headers: headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(path, init).then(function (response) {
      return response.text().then(function (text) {
        var data = null;
        if (text) { try { data = JSON.parse(text); } catch (e) { data = null; } }
        if (response.status !== 0) { siteAnswered(); }
        return { status: response.status, ok: response.ok, data: data, retryAfter: response.headers.get("Retry-After") };
      });
    }, function () {
      return { status: 0, ok: false, data: null };
    });
  }

  function errorCode(result) {
    var err = result.data && result.data.error;
    return err && err.code ? err.code : null;
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

  // The token goes to the site once, as JSON; the site answers with a
  // server-side session whose random id (never the token) is an HttpOnly,
  // SameSite=Strict cookie that every later call and the WebSocket carry.
  // The browser adds this page's Origin to the POST, which the site requires
  // of every cookie write; the session ends at sign-out, after 12 h unused
  // or 7 days at most, or when the token is rotated (401: sign in again).
  function signIn(token) {
    return api("POST", "/api/session", { token: token }).then(function (result) {
      if (result.status === 401) { return { ok: false, message: t("tokenRejected") }; }
      if (!result.ok) {
        return { ok: false, message: errorSentence(result) };
      }
      return resumeSession();
    });
  }

  // Signed in when the cookie is accepted (after sign-in, or a reload).
  function resumeSession() {
    return api("GET", "/api/usage").then(function (result) {
      if (result.status === 401) {
        state.signedIn = false;
        return { ok: false, unauthorized: true, message: t("tokenRejected") };
      }
      if (!result.ok) {
        state.signedIn = false;
        return { ok: false, message: errorSentence(result) };
      }
      state.signedIn = true;
      showSignedIn(true);
      renderUsage(result.data);
      startSession();
      return { ok: true };
    });
  }

  function signOut() {
    stopSession();
    state.signedIn = false;
    api("DELETE", "/api/session");  // clears the cookie
    resetListLoads();
    state.tasks.clear();
    state.order = [];
    state.favorites.clear();
    state.nodeUp.clear();
    state.nodeSince.clear();
    $("task-list").textContent = "";
    state.selected.clear();
    state.detailsOpen.clear();
    state.archiveNotes.clear();
    showLinksResult(null);
    state.me = null;
    renderWho();
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
    loadMe();
    connectEvents();
    watchUpstream();
  }

  // The site's word on the upstream (GET /api/upstream): its own calls,
  // and the caller's downloads whose node cannot reach it, on every page
  // whatever rows it shows; asked every 15 s while signed in.
  var UPSTREAM_POLL_MS = 15000;
  function loadUpstream() {
    return api("GET", "/api/upstream").then(function (result) {
      state.upstream = result.ok && result.data ? result.data.upstream || null : null;
      tickRetries();
    });
  }
  // A push that may change the site's count (a retry said, or any change
  // while some download cannot reach it): asked again within a second.
  function scheduleUpstreamFor(task) {
    var retrying = /^retrying in /.test(task.detail || "");
    var counted = state.upstream && Number(state.upstream.downloadsNotReaching) > 0;
    if ((!retrying && !counted) || state.upstreamSoon) { return; }
    state.upstreamSoon = setTimeout(function () { state.upstreamSoon = null; loadUpstream(); }, 1000);
  }
  function watchUpstream() {
    loadUpstream();
    if (!state.upstreamTimer) { state.upstreamTimer = setInterval(loadUpstream, UPSTREAM_POLL_MS); }
  }

  // Who is signed in, on which site: /api/me ({user, site}); the site's
  // name from /healthz when /api/me does not say it.
  function loadMe() {
    api("GET", "/api/me").then(function (result) {
      if (!result.ok || !result.data) { return; }
      state.me = result.data.user || null;
      // The users table may have come first: mark the admin's own row
      // ("(you)", no Disable or New token on it) now that we know it.
      if (state.users) { renderUsers(); }
      var site = result.data.site;
      if (site && typeof site === "object") {
        if (Number(site.upstreamTimeout) > 0) { state.upstreamTimeout = Number(site.upstreamTimeout); }
        site = site.name || site.id || null;
      }
      if (Number(result.data.upstreamTimeout) > 0) { state.upstreamTimeout = Number(result.data.upstreamTimeout); }
      if (site) { state.site = String(site); renderWho(); return; }
      renderWho();
      api("GET", "/healthz").then(function (health) {
        if (health.data && health.data.site) { state.site = String(health.data.site); renderWho(); }
      });
    });
  }

  function renderWho() {
    var who = $("who");
    var parts = [];
    if (state.me && state.me.name) { parts.push(t("whoUser", { user: state.me.name })); }
    if (state.site) { parts.push(t("whoSite", { site: state.site })); }
    who.textContent = parts.join(" · ");
    who.hidden = !state.signedIn || !parts.length;
  }

  function stopSession() {
    if (state.reconnectTimer) { clearTimeout(state.reconnectTimer); state.reconnectTimer = null; }
    if (state.pollTimer) { clearInterval(state.pollTimer); state.pollTimer = null; }
    if (state.unknownTimer) { clearInterval(state.unknownTimer); state.unknownTimer = null; }
    if (state.verdictTimer) { clearTimeout(state.verdictTimer); state.verdictTimer = null; }
    if (state.nodesTimer) { clearTimeout(state.nodesTimer); state.nodesTimer = null; }
    if (state.upstreamTimer) { clearInterval(state.upstreamTimer); state.upstreamTimer = null; }
    if (state.upstreamSoon) { clearTimeout(state.upstreamSoon); state.upstreamSoon = null; }
    state.upstream = null;
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
    $("usage-text").textContent = t("usageText", { week: usage.week, used: num(used), quota: num(quota), left: num(Math.max(quota - used, 0)) });
    state.usage = usage;
  }

  function num(n) { return F.number(Number(n) || 0, state.lang, 0); }

  // Task events change usage (a create charged, a delete or "not submitted"
  // released): read it again at most once a second.
  function scheduleUsage() {
    if (state.usageTimer) { return; }
    state.usageTimer = setTimeout(function () { state.usageTimer = null; loadUsage(); }, 1000);
  }

  function loadUsage() {
    return api("GET", "/api/usage").then(function (result) {
      if (result.ok) { renderUsage(result.data); }
    });
  }

  // ---- tasks --------------------------------------------------------------

  // The status tabs: each is a set of display keys (GET /api/tasks?status=).
  // "In progress" is what is being worked on: SUBMITTED without its QUEUED
  // part, so a legacy node's long queue is counted under Queued alone.
  var FILTERS = {
    all: null,
    active: ["SUBMITTING", "SUBMITTED_NOT_QUEUED", "DOWNLOADING", "WAITING_COMPRESSION", "COMPRESSING"],
    // Held by a node, not started (GET /api/tasks?status=QUEUED; counts.QUEUED).
    queued: ["QUEUED"],
    completed: ["COMPLETED"],
    attention: ["SUBMIT_UNKNOWN", "DELETE_PENDING", "DELETE_FAILED", "ARCHIVE_GONE"]
  };
  var ORDERS = ["newest", "oldest", "gid", "size", "progress", "status"];
  var PAGE_SIZES = [50, 100, 200, 500];

  // Full-width digits (１２３) and spaces typed with a Chinese IME, as ASCII.
  function asciiDigits(text) {
    return String(text || "").replace(/[\uFF10-\uFF19]/g, function (c) { return String.fromCharCode(c.charCodeAt(0) - 0xFEE0); })
      .replace(/\u3000/g, " ");
  }

  function taskName(task) { return task.name || ("gid " + task.gid); }

  // A view with no status (released, resolved "not submitted") or a DELETED
  // tombstone: the task is gone and its row must go too.
  function isGone(task) { return task && (task.state === "DELETED" || !task.status); }

  function listPath(paged, limit, after, pageNumber) {
    var params = [];
    var keys = FILTERS[state.filter];
    if (keys) { params.push("status=" + keys.join(",")); }
    if (state.query) { params.push("q=" + encodeURIComponent(state.query)); }
    if (state.favoriteOnly) { params.push("favorite=1"); }
    if (state.nodeFilter) { params.push("node=" + encodeURIComponent(state.nodeFilter)); }
    params.push("order=" + state.orderBy);
    params.push("limit=" + limit);
    if (paged && after !== null && after !== undefined) { params.push("after=" + encodeURIComponent(after)); }
    else if (pageNumber > 1) { params.push("page=" + pageNumber); }
    return "/api/tasks?" + params.join("&");
  }

  // The list's loads run one at a time, so "Load more" and a live refresh
  // (the socket's reconnect, the Refresh button, a bulk action) never
  // undo each other: a refresh asked while "Load more" is out runs after
  // it and reads every row shown, the new page's too; "Load more" asked
  // while a refresh is out continues from the refreshed cursor.  A change
  // of the view (tab, search, order, filters) drops what the old view's
  // loads answer (listSeq) and starts at once.
  function loadTasks(append) {
    if (append) { state.listWant.more = true; } else { state.listWant.refresh = true; loadCounts(); }
    return pumpList();
  }

  function pumpList() {
    if (state.listBusy) { return state.listBusy; }
    var want = state.listWant;
    if (!want.refresh && !want.more) { return Promise.resolve(); }
    var append = !want.refresh;
    if (append) { want.more = false; } else { want.refresh = false; }
    if (append && (state.next === null || state.next === undefined)) { return Promise.resolve(); }
    var seq = state.listSeq;
    var since = state.pushSeq;
    var busy = (append ? readMore() : readShown()).then(function (answer) {
      if (state.listBusy === busy) { state.listBusy = null; }
      if (seq === state.listSeq) { applyList(answer, append, since); }
      return pumpList();
    });
    state.listBusy = busy;
    return busy;
  }

  // The page after the last row shown: {result, tasks, total, next}.
  function readMore() {
    return api("GET", listPath(true, state.pageSize, state.next)).then(function (result) {
      var data = result.data || {};
      return { result: result, tasks: data.tasks || [], total: data.total, next: data.next };
    });
  }

  // As many rows as are shown (at least a page), in pages of at most 500;
  // the table: its one page, from where that page starts.
  function readShown() {
    var keep = state.tableView ? state.pageSize : Math.max(state.pageSize, state.order.length);
    var at = state.tableView ? state.pageAt : null;
    var start = at && at.after !== undefined ? at.after : null;
    var number = at && at.page ? at.page : 1;  // a page by its number: GET /api/tasks?page=N
    var answer = { result: null, tasks: [], total: undefined, next: null };
    function page(after) {
      var limit = Math.min(500, keep - answer.tasks.length);
      return api("GET", listPath(after !== null, limit, after, after === null ? number : 1)).then(function (result) {
        answer.result = result;
        if (!result.ok) { return answer; }
        var data = result.data || {};
        var got = data.tasks || [];
        if (answer.total === undefined) { answer.total = data.total; }
        answer.tasks = answer.tasks.concat(got);
        answer.next = data.next === undefined ? null : data.next;
        if (answer.tasks.length < keep && answer.next !== null && got.length) { return page(answer.next); }
        return answer;
      });
    }
    return page(start);
  }

  // Is version ``a`` of a task strictly newer than ``b`` (pushes can overtake an answer)?
  function isNewer(a, b) {
    var ta = a && F.toDate(a.updatedAt), tb = b && F.toDate(b.updatedAt);
    return !!(ta && tb && ta.getTime() > tb.getTime());
  }

  // The newer of two versions; ``b`` when neither is.
  function newerOf(a, b) { return isNewer(a, b) ? a : b; }

  function applyList(answer, append, since) {
    var result = answer.result;
    if (result.status === 401) { signOut(); return; }
    if (!result.ok) { notify(failureText("loadFailed", result), true, result.status === 0 ? "reach" : ""); return; }
    var keptTasks = state.tasks, keptOrder = state.order;
    if (!append) { state.tasks = new Map(); state.order = []; }
    if (typeof answer.total === "number") { state.total = answer.total; } else if (!append) { state.total = null; }
    answer.tasks.forEach(function (task) {
      if (isGone(task)) { return; }
      var gone = state.gone.get(task.gid);
      if (gone !== undefined && gone !== null && gone === task.operationId) { return; }  // removed meanwhile
      var known = state.tasks.get(task.gid) || (!append ? keptTasks.get(task.gid) : null);
      if (!state.tasks.has(task.gid)) { state.order.push(task.gid); }
      // A push that came while this was read is the newer truth.
      var pushedMeanwhile = known && (state.pushedAt.get(task.gid) || 0) > since;
      state.tasks.set(task.gid, pushedMeanwhile ? newerOf(task, known) : task);
    });
    state.next = answer.next === undefined ? null : answer.next;
    if (!append) {
      // Rows a push brought while the refresh was out (created meanwhile):
      // kept where they belong.
      keptOrder.forEach(function (gid) {
        if (state.tasks.has(gid) || (state.pushedAt.get(gid) || 0) <= since) { return; }
        var task = keptTasks.get(gid);
        if (!task) { return; }
        var at = insertAt(task);
        if (at < 0) { return; }
        state.order.splice(at, 0, gid);
        state.tasks.set(gid, task);
      });
    }
    learnNodes(state.order.map(function (gid) { return state.tasks.get(gid); }));
    renderTaskList();
  }

  // Is the task under one of these filter keys?  SUBMITTED is both of its
  // parts, QUEUED and SUBMITTED_NOT_QUEUED.
  function statusMatches(task, keys) {
    if (keys.indexOf(task.status) !== -1) { return true; }
    return task.status === "SUBMITTED" && keys.indexOf(task.queued ? "QUEUED" : "SUBMITTED_NOT_QUEUED") !== -1;
  }

  // Does a task that is not on the page belong at the top of what is shown?
  function matchesView(task) {
    var keys = FILTERS[state.filter];
    if (keys && !statusMatches(task, keys)) { return false; }
    if (state.favoriteOnly && !state.favorites.has(task.gid)) { return false; }
    if (state.nodeFilter && task.node !== state.nodeFilter) { return false; }
    if (!state.query) { return true; }
    var q = state.query.toLowerCase();
    return String(task.gid).indexOf(q) !== -1 || String(task.name || "").toLowerCase().indexOf(q) !== -1;
  }

  // Does the site count queued tasks apart (counts.QUEUED)?
  function queuedCounted() { return !!state.counts && "QUEUED" in state.counts; }

  // The list's order, as the API sorts it: (createdAt, gid) newest or
  // oldest first, or gid.  Negative when a comes before b.
  function compareTasks(a, b) {
    if (state.orderBy === "gid") { return a.gid - b.gid; }
    if (state.orderBy !== "newest" && state.orderBy !== "oldest") { return 1; }  // the site's order: after the loaded rows
    var ka = String(a.createdAt || ""), kb = String(b.createdAt || "");
    var c = ka < kb ? -1 : ka > kb ? 1 : a.gid - b.gid;
    return state.orderBy === "oldest" ? c : -c;
  }

  // Where a task that is new to the page goes: its place in the order among
  // the loaded rows (a task created now is the top row of newest first).  A
  // task that sorts after the last loaded row belongs to a later page and is
  // not shown until that page is loaded, so rows never jump.
  function insertAt(task) {
    if (!matchesView(task)) { return -1; }
    if (state.tableView && state.pageNumber > 1) { return -1; }  // a later page of the table: not its top
    var hasMore = state.next !== null && state.next !== undefined;
    if (state.orderBy !== "newest" && state.orderBy !== "oldest" && state.orderBy !== "gid") { return hasMore ? -1 : state.order.length; }
    for (var i = 0; i < state.order.length; i++) {
      if (compareTasks(task, state.tasks.get(state.order[i])) < 0) { return i; }
    }
    return hasMore ? -1 : state.order.length;
  }

  function upsertTask(task) {
    if (!task || task.gid === undefined) { return; }
    var gone = state.gone.get(task.gid);
    if (gone !== undefined && gone !== null && gone === task.operationId) { return; }  // a late push of a removed task
    if (isGone(task)) { removeTask(task.gid, { quiet: !state.tasks.has(task.gid), operationId: task.operationId }); return; }
    var previous = state.tasks.get(task.gid);
    var row = document.querySelector('#task-list > li[data-gid="' + task.gid + '"]');
    // An answer that left before a push the page already has (a create's
    // 201 after the node's first report): the row keeps the newer one.
    if (previous && isNewer(previous, task)) { return row; }
    state.gone.delete(task.gid);
    state.pushedAt.set(task.gid, ++state.pushSeq);
    if (!previous || previous.status !== task.status || !!previous.queued !== !!task.queued) { scheduleCounts(); scheduleUsage(); }
    if (previous && previous.status !== task.status) { state.archiveNotes.delete(task.gid); }
    noteNode(task.node);
    settleCreateResult(task);
    if (!previous) {
      var at = insertAt(task);
      if (at < 0) { return; }
      state.order.splice(at, 0, task.gid);
      if (state.total !== null) { state.total += 1; }
    }
    state.tasks.set(task.gid, task);
    if (state.tableView) { updateTableRow(task.gid); showEmpty(); learnNodes([task]); return null; }
    var fresh = renderTask(task);
    var updates = row ? Number(row.getAttribute("data-live-updates") || 0) : 0;
    fresh.setAttribute("data-live-updates", String(updates));
    if (row) { keepFocus(row, fresh); row.replaceWith(fresh); }
    else {
      var list = $("task-list");
      var index = state.order.indexOf(task.gid);
      var after = index + 1 < state.order.length ? list.querySelector('li[data-gid="' + state.order[index + 1] + '"]') : null;
      list.insertBefore(fresh, after);
    }
    showEmpty();
    schedulePendingPoll();
    learnNodes([task]);
    return fresh;
  }

  // ---- node liveness on the rows --------------------------------------------
  //
  // A task's view says whether its node is connected (nodeConnected); every
  // row of a node says the same, so one push that says a node dropped (or
  // came back) marks all of that node's rows shown, not only its own.  When
  // it went offline: the node panel's "last seen" (admins), else the moment
  // this page first saw it offline.

  // Statuses whose row depends on the node (queued, downloading, a delete waiting for it).
  var NODE_BOUND = ["SUBMITTED", "DOWNLOADING", "WAITING_COMPRESSION", "COMPRESSING", "DELETE_PENDING"];

  function learnNodes(tasks) {
    var flipped = [];
    tasks.forEach(function (task) {
      if (!task || !task.node || typeof task.nodeConnected !== "boolean") { return; }
      if (NODE_BOUND.indexOf(task.status) === -1) { return; }
      if (setNodeUp(task.node, task.nodeConnected, null)) { flipped.push(task.node); }
    });
    flipped.forEach(markNodeRows);
    scheduleLiveText();
  }

  // Record a node's state; true when it changed.
  function setNodeUp(node, up, lastSeenAt) {
    var before = state.nodeUp.get(node);
    state.nodeUp.set(node, up);
    if (up) { state.nodeSince.delete(node); }
    else if (lastSeenAt) { state.nodeSince.set(node, lastSeenAt); }
    else if (!state.nodeSince.has(node) && before === true) { state.nodeSince.set(node, new Date().toISOString()); }
    return before !== undefined && before !== up;
  }

  // Re-render the rows of ``node`` whose view disagrees with what is known of it now.
  function markNodeRows(node) {
    var up = state.nodeUp.get(node);
    state.order.forEach(function (gid) {
      var task = state.tasks.get(gid);
      if (!task || task.node !== node || NODE_BOUND.indexOf(task.status) === -1) { return; }
      if (task.nodeConnected === up) { return; }
      var changed = Object.assign({}, task, { nodeConnected: up });
      if (!up) { changed.speed = null; changed.eta = null; }
      state.tasks.set(gid, changed);
      rerenderRow(gid);
    });
  }

  function rerenderRow(gid) {
    var row = document.querySelector('#task-list > li[data-gid="' + gid + '"]');
    var task = state.tasks.get(gid);
    if (!row || !task) { return; }
    var fresh = renderTask(task);
    fresh.setAttribute("data-live-updates", row.getAttribute("data-live-updates") || "0");
    keepFocus(row, fresh);
    row.replaceWith(fresh);
  }

  // The nodes the rows shown wait for while they are offline: the Live
  // indicator names them (it is the socket that is live, not those rows).
  function offlineNodes() {
    var found = new Set();
    state.order.forEach(function (gid) {
      var task = state.tasks.get(gid);
      if (task && task.node && task.nodeConnected === false && NODE_BOUND.indexOf(task.status) !== -1) { found.add(task.node); }
    });
    return Array.from(found).sort();
  }

  function scheduleLiveText() {
    if (state.liveTextTimer) { return; }
    state.liveTextTimer = setTimeout(function () { state.liveTextTimer = null; renderLiveText(); }, 100);
  }

  // options.quiet: no "deleted" notice (e.g. resolved "not submitted");
  // options.operationId: the generation that is gone (late pushes of it are ignored).
  function removeTask(gid, options) {
    options = options || {};
    var known = state.tasks.get(gid);
    var operationId = options.operationId !== undefined ? options.operationId : (known ? known.operationId : null);
    if (operationId) { state.gone.set(gid, operationId); }
    var wasKnown = state.tasks.delete(gid);
    if (wasKnown && state.total !== null) { state.total = Math.max(0, state.total - 1); }
    state.selected.delete(gid);
    state.order = state.order.filter(function (g) { return g !== gid; });
    state.favorites.delete(gid);
    if (state.tableView) { updateTableRow(gid); }
    var row = document.querySelector('#task-list > li[data-gid="' + gid + '"]');
    if (row) {
      var hadFocus = row.contains(document.activeElement);
      row.remove();
      if (hadFocus) { $("tasks-title").setAttribute("tabindex", "-1"); $("tasks-title").focus(); }
    }
    if (wasKnown) {
      if (!options.quiet) { notify(t("deleted", { gid: gid })); }
      loadUsage();
      scheduleCounts();
    }
    showEmpty();
  }

  function showEmpty() {
    var empty = $("tasks-empty");
    empty.hidden = state.order.length > 0;
    empty.textContent = state.filter === "all" && !state.query && !state.favoriteOnly && !state.nodeFilter ? t("noTasks") : t("noMatch");
    renderShownCount();
    renderSelection();
    scheduleLiveText();
  }

  // "50 of 3,001": rows shown and tasks matching (the list answer's total;
  // without it, the status counts when no other filter applies).
  function renderShownCount() {
    var shown = state.order.length;
    var total = state.total;
    if (total === null && state.counts && !state.favoriteOnly && !state.nodeFilter) { total = tabCount(state.filter); }
    var box = $("tasks-count");
    box.textContent = total === null ? t("shownOnly", { shown: num(shown) }) : t("shownOf", { shown: num(shown), total: num(Math.max(total, shown)) });
    box.setAttribute("data-shown", String(shown));
    box.setAttribute("data-total", total === null ? "" : String(total));
  }

  // The node filter offers every node this page has seen (and, for an admin, the node panel's).
  function noteNode(id) {
    if (!id || state.knownNodes.has(id)) { return; }
    state.knownNodes.add(id);
    var select = $("task-node");
    var ids = Array.from(state.knownNodes).sort();
    var current = select.value || state.nodeFilter;
    Array.from(select.options).slice(1).forEach(function (o) { o.remove(); });
    ids.forEach(function (n) { select.appendChild(el("option", { value: n, text: n })); });
    select.value = current;
  }

  // The create form's "waiting for a node to download it" is over once the
  // task moved on (a node took it, it completed): "Task 42 created." stays.
  function settleCreateResult(task) {
    var result = $("create-result");
    if (!task || result.getAttribute("data-gid") !== String(task.gid) || state.createTimer) { return; }
    if (result.getAttribute("data-outcome") === "201" && task.status !== "SUBMITTED" && result.getAttribute("data-settled") !== "true") {
      result.textContent = t("createdMoved", { gid: task.gid });
      result.setAttribute("data-settled", "true");
    }
  }

  // ---- bulk select -----------------------------------------------------------

  // "Select all N matching" acts on the whole view (filter, search, node,
  // favourites) through the API: POST /api/tasks/bulk with the view's
  // filter and the N the person confirmed; the site counts, bounds
  // (--max-bulk-matching) and acts.

  function selectedGids() { return state.order.filter(function (g) { return state.selected.has(g); }); }

  // Retry applies only to a failed delete: the button says how many it acts on.
  function retryableCount() {
    if (state.selectMatching) { return state.matchingRetryable || 0; }
    return selectedGids().filter(function (g) { var task = state.tasks.get(g); return task && task.status === "DELETE_FAILED"; }).length;
  }

  function renderSelection() {
    var matching = !!state.selectMatching;
    var n = matching ? (state.total || 0) : state.selected.size;
    $("bulk-bar").hidden = n === 0;
    $("bulk-count").textContent = matching ? t("matchingSelected", { n: num(n) }) : t("selectedN", { n: num(n) });
    var all = $("select-all");
    var shown = state.order.length;
    var ticked = state.order.filter(function (g) { return state.selected.has(g); }).length;
    all.checked = shown > 0 && ticked === shown;
    all.indeterminate = ticked > 0 && ticked < shown;
    all.disabled = shown === 0;
    var retryable = retryableCount();
    var retry = $("bulk-retry");
    retry.hidden = retryable === 0;
    retry.textContent = t("bulkRetryN", { n: num(retryable) });
    $("bulk-links").hidden = matching;
    // Offered once every shown row is ticked and more match than are shown.
    var more = $("select-matching");
    var total = typeof state.total === "number" ? state.total : 0;
    more.hidden = matching || !(shown > 0 && ticked === shown && total > shown);
    more.textContent = t("selectMatching", { n: num(total) });
  }

  // The view's filter as POST /api/tasks/bulk takes it.
  function viewFilter() {
    var filter = { status: FILTERS[state.filter] || [], q: state.query, favorite: !!state.favoriteOnly };
    if (state.nodeFilter) { filter.node = state.nodeFilter; }
    return filter;
  }

  // "Select all N matching": how many failed deletes the whole view holds
  // (its tab, search, node and favourites: the list's total of the view
  // narrowed to DELETE_FAILED), for "Retry delete (N)".
  function selectMatching() {
    state.selectMatching = true;
    state.matchingRetryable = null;
    renderSelection();
    var keys = FILTERS[state.filter];
    if (keys && keys.indexOf("DELETE_FAILED") === -1) { state.matchingRetryable = 0; return; }
    var seq = state.listSeq;
    var params = ["status=DELETE_FAILED", "limit=1"];
    if (state.query) { params.push("q=" + encodeURIComponent(state.query)); }
    if (state.favoriteOnly) { params.push("favorite=1"); }
    if (state.nodeFilter) { params.push("node=" + encodeURIComponent(state.nodeFilter)); }
    api("GET", "/api/tasks?" + params.join("&")).then(function (result) {
      if (seq !== state.listSeq || !state.selectMatching || !result.ok || !result.data) { return; }
      state.matchingRetryable = Number(result.data.total) || 0;
      renderSelection();
    });
  }

  function selectAllShown(on) {
    if (!on) { state.selectMatching = false; }
    state.order.forEach(function (gid) { if (on) { state.selected.add(gid); } else { state.selected.delete(gid); } });
    document.querySelectorAll('#task-list input[data-action="select"], #task-table input[data-action="select"]').forEach(function (box) { box.checked = on; });
    renderSelection();
  }

  // The last bulk action's outcome stays under the list bar, with why each
  // task was not done, until it is dismissed or the next one; it follows a
  // change of language.
  function showBulkResult(outcome) {
    state.bulkResult = outcome;
    renderBulkResult();
  }

  var BULK_REASONS = { conflict: "bulkReasonConflict", not_found: "bulkReasonGone", unavailable: "bulkReasonBusy", not_retryable: "bulkReasonNoRetry" };

  function renderBulkResult() {
    var box = $("bulk-result");
    if (!box) { return; }
    var outcome = state.bulkResult;
    box.textContent = "";
    box.hidden = !outcome;
    if (!outcome) { return; }
    box.className = "result bulk-result" + (outcome.failed || outcome.tooMany ? " warn" : "");
    if (outcome.working) { box.appendChild(el("span", { "data-role": "bulk-progress", text: outcome.working() })); return; }
    if (outcome.tooMany) {
      box.appendChild(el("span", { "data-role": "bulk-outcome", text: t("matchingTooMany", { max: num(outcome.max), n: num(outcome.tooMany) }) }));
    } else if (outcome.countChanged) {
      box.appendChild(el("span", { "data-role": "bulk-outcome", text: t("matchingCountChanged", { n: num(outcome.countChanged.now), m: num(outcome.countChanged.confirmed) }) }));
    } else {
      box.appendChild(el("span", { "data-role": "bulk-outcome", text: t("bulkResultTitle", {
        action: t(outcome.action === "delete" ? "bulkDelete" : "bulkRetry"),
        ok: num(outcome.ok), failed: num(outcome.failed), skipped: num(outcome.skipped) }) }));
      var list = el("ul", { className: "bulk-reasons" });
      Object.keys(outcome.reasons).forEach(function (code) {
        // The gids, or (the site's summary of a whole view) {count, gids: the first ones}.
        var reason = outcome.reasons[code];
        var gids = Array.isArray(reason) ? reason : (reason.gids || []);
        var count = Array.isArray(reason) ? reason.length : Number(reason.count) || gids.length;
        var words = t(BULK_REASONS[code] || "bulkReasonOther", { n: num(count) });
        var shown = gids.slice(0, 10).join(", ") + (count > 10 ? "…" : "");
        list.appendChild(el("li", { "data-reason": code, text: words + " (" + t("bulkResultGids", { list: shown }) + ")" }));
      });
      if (list.childNodes.length) { box.appendChild(list); }
    }
    var dismiss = el("button", { type: "button", className: "link-button", "data-role": "bulk-dismiss", text: t("bulkResultDismiss") });
    dismiss.addEventListener("click", function () { showBulkResult(null); });
    box.appendChild(dismiss);
  }

  // POST /api/tasks/bulk: the ticked gids in chunks of 500 (a site without
  // it gets one call per task), or the whole view by its filter.
  function bulkAction(action) {
    var del = action === "delete";
    var matching = !!state.selectMatching;
    var total = matching ? (state.total || 0) : state.selected.size;
    if (!total) { return; }
    var chosen = selectedGids();
    var retryable = del ? chosen : chosen.filter(function (g) { var task = state.tasks.get(g); return task && task.status === "DELETE_FAILED"; });
    var text;
    if (matching) { text = t(del ? "bulkMatchingDeleteText" : "bulkMatchingRetryText", { n: num(total), r: num(retryableCount()) }); }
    else if (del) { text = t("bulkDeleteText", { n: num(chosen.length) }); }
    else { text = t("bulkRetryOnly", { n: num(retryable.length), skip: num(chosen.length - retryable.length) }); }
    confirmDialog({
      title: t(del ? "bulkDeleteTitle" : "bulkRetryTitle", { n: num(del ? total : (matching ? retryableCount() : retryable.length)) }),
      text: text,
      ok: del ? t("bulkDelete") : t("bulkRetryN", { n: num(matching ? retryableCount() : retryable.length) }), danger: del
    }).then(function (answer) {
      if (!answer) { return; }
      if (matching) { return runBulkMatching(action, total); }
      return runBulk(action, retryable, chosen.length - retryable.length, chosen);
    });
  }

  // The whole view: the site acts only if the filter still matches the
  // number confirmed (else 409 count_changed) and no more than its bound
  // (413 too_many_tasks); either way the outcome stays on screen.
  function runBulkMatching(action, total) {
    showBulkResult({ working: function () { return t("bulkMatchingWorking", { n: num(total) }); } });
    return api("POST", "/api/tasks/bulk", { action: action, filter: viewFilter(), expect: total }).then(function (result) {
      var data = result.data || {};
      var error = data.error || {};
      if (result.status === 409 && error.code === "count_changed") {
        state.total = Number(error.count) || 0;
        showBulkResult({ countChanged: { now: state.total, confirmed: total } });
      } else if (result.status === 413 && error.code === "too_many_tasks") {
        showBulkResult({ tooMany: Number(error.count) || total, max: Number(error.max) || 0 });
      } else if (!result.ok || typeof data.done !== "number") {
        showBulkResult(null);
        notify(failureText("loadFailed", result), true);
        return;
      } else {
        showBulkResult({ action: action, ok: data.done, failed: data.notDone, skipped: data.notApplicable, reasons: data.reasons || {} });
      }
      // Done or refused, the whole view was the selection: it is dropped.
      state.selected.clear();
      state.selectMatching = false;
      renderSelection();
      renderShownCount();
      loadCounts();
      loadUsage();
      loadTasks(false);
    });
  }

  function runBulk(action, gids, skipped, chosen) {
    var del = action === "delete";
    var ok = 0, failedN = 0, done = 0, reasons = {};
    if (!del && skipped && !state.selectMatching) {
      reasons.not_retryable = chosen.filter(function (g) { return gids.indexOf(g) === -1; });
    }
    function progress() {
      showBulkResult({ working: function () { return t("bulkWorking", { done: num(done), n: num(gids.length) }); } });
    }
    function settle(item) {
      done += 1;
      var gid = Number(item.gid);
      if (item.error) {
        failedN += 1;
        var code = typeof item.error === "string" ? item.error : (item.error.code || "other");
        (reasons[code] = reasons[code] || []).push(gid);
        return;
      }
      ok += 1;
      state.selected.delete(gid);
      if (item.task && !isGone(item.task)) { upsertTask(item.task); }
      else { removeTask(gid, { quiet: true }); }
    }
    function one(gid) {
      return api("DELETE", "/api/tasks/" + gid).then(function (result) {
        if (result.ok || result.status === 404) { return { gid: gid, task: result.data && result.data.task }; }
        return { gid: gid, error: errorCode(result) || "other" };
      });
    }
    function fallback(chunk) {
      var queue = chunk.slice();
      function worker() {
        var gid = queue.shift();
        if (gid === undefined) { return Promise.resolve(); }
        return one(gid).then(function (item) { settle(item); progress(); return worker(); });
      }
      var workers = [];
      for (var i = 0; i < 8; i++) { workers.push(worker()); }
      return Promise.all(workers);
    }
    var chunks = [];
    for (var i = 0; i < gids.length; i += 500) { chunks.push(gids.slice(i, i + 500)); }
    var useFallback = false;
    progress();
    return chunks.reduce(function (chain, chunk) {
      return chain.then(function () {
        if (useFallback) { return fallback(chunk); }
        return api("POST", "/api/tasks/bulk", { action: action, gids: chunk }).then(function (result) {
          if (result.status === 404 || result.status === 405) { useFallback = true; return fallback(chunk); }
          if (!result.ok || !result.data || !Array.isArray(result.data.results)) {
            chunk.forEach(function (gid) { settle({ gid: gid, error: errorCode(result) || "other" }); });
            return;
          }
          result.data.results.forEach(settle);
          progress();
        });
      });
    }, Promise.resolve()).then(function () {
      state.selectMatching = false;
      showBulkResult({ action: action, ok: ok, failed: failedN, skipped: skipped, reasons: reasons });
      renderSelection();
      loadCounts();
      loadUsage();
      if (del) { loadTasks(false); }
    });
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
    var table = !!state.tableView;
    list.hidden = table;
    $("task-table-wrap").hidden = !table;
    if (table) { renderTable(); } else {
      $("task-table").textContent = "";
      renderPager();
      state.order.forEach(function (gid) { list.appendChild(renderTask(state.tasks.get(gid))); });
    }
    showEmpty();
    $("tasks-more").hidden = table || state.next === null || state.next === undefined;
    schedulePendingPoll();
    scheduleLiveText();
  }

  // ---- the table view ----------------------------------------------------------
  //
  // A dense table beside the cards: one line a task, the columns a person
  // chose (kept in localStorage), sorted by a click on a column the API
  // sorts by.  It shows one page at a time on the keyset cursor (First,
  // Previous, Next): every page is one bounded read and replaces the last,
  // so page 60 costs what page 1 does and the page does not grow.

  var TABLE_KEY = "tasknet.listView";
  var COLUMNS_KEY = "tasknet.tableColumns";
  // [key, label, the order a click asks for (null: not sortable)]
  var TABLE_COLUMNS = [
    ["gid", "colGid", "gid"], ["name", "colName", null], ["status", "colStatus", "status"],
    ["progress", "colProgress", "progress"], ["size", "colSize", "size"], ["speed", "colSpeed", null],
    ["node", "colNode", null], ["owner", "colOwner", null], ["cost", "colCost", null], ["created", "colCreated", "newest"]
  ];
  var DEFAULT_COLUMNS = ["gid", "name", "status", "progress", "size", "speed", "node", "created"];

  function tableColumns() {
    var saved = null;
    try { saved = JSON.parse(localStorage.getItem(COLUMNS_KEY) || "null"); } catch (e) { saved = null; }
    var known = TABLE_COLUMNS.map(function (c) { return c[0]; });
    var chosen = Array.isArray(saved) ? saved.filter(function (k) { return known.indexOf(k) !== -1; }) : DEFAULT_COLUMNS;
    return chosen.length ? chosen : DEFAULT_COLUMNS;
  }

  function setTableView(on) {
    if (state.tableView === on) { return; }
    state.tableView = on;
    localStorage.setItem(TABLE_KEY, on ? "table" : "cards");
    resetPages();
    writeHash();
    renderViewToggle();
    resetListLoads();
    loadTasks(false);
  }

  function renderViewToggle() {
    $("view-cards").setAttribute("aria-pressed", state.tableView ? "false" : "true");
    $("view-table").setAttribute("aria-pressed", state.tableView ? "true" : "false");
    $("table-columns").hidden = !state.tableView;
    var chosen = tableColumns();
    var menu = $("table-columns-list");
    menu.textContent = "";
    TABLE_COLUMNS.forEach(function (column) {
      var id = "column-" + column[0];
      menu.appendChild(el("li", { className: "check" }, [
        el("input", { type: "checkbox", id: id, "data-column": column[0], checked: chosen.indexOf(column[0]) !== -1 }),
        el("label", { htmlFor: id, text: t(column[1]) })
      ]));
    });
  }

  function onColumnChoice(event) {
    var box = event.target.closest("input[data-column]");
    if (!box) { return; }
    var chosen = Array.from(document.querySelectorAll("#table-columns-list input[data-column]"))
      .filter(function (b) { return b.checked; }).map(function (b) { return b.getAttribute("data-column"); });
    if (!chosen.length) { box.checked = true; return; }  // a table keeps one column at least
    localStorage.setItem(COLUMNS_KEY, JSON.stringify(chosen));
    renderTaskList();
  }

  function tableCell(key, task) {
    var size = typeof task.size === "number" ? task.size : null;
    var percent = Math.round(Math.max(0, Math.min(1, Number(task.progress) || 0)) * 100);
    if (task.status === "COMPLETED") { percent = 100; }
    switch (key) {
      case "gid": return el("td", { className: "num", text: String(task.gid) });
      case "name": return el("td", { className: "name", title: taskName(task), text: taskName(task) });
      case "status": {
        var note = rowNote(task);
        return el("td", { "data-status": task.status, text: statusLabel(task) + (note ? " · " + note.text : "") });
      }
      case "progress": return el("td", { className: "num", text: F.number(percent, state.lang, 0) + "%" });
      case "size": return el("td", { className: "num", text: size === null ? "—" : F.bytes(size, state.lang) });
      case "speed": {
        var live = task.status === "DOWNLOADING" && task.nodeConnected !== false && typeof task.speed === "number";
        return el("td", { className: "num", text: live ? F.speed(task.speed, state.lang) : "—" });
      }
      case "node": return el("td", { text: task.node || "—" });
      case "owner": return el("td", { text: task.owner || "—" });
      case "cost": return el("td", { className: "num", text: task.cost === null || task.cost === undefined ? "—" : num(task.cost) });
      case "created": return el("td", { className: "num", text: task.createdAt ? clock(task.createdAt) : "—" });
    }
    return el("td", { text: "" });
  }

  function renderTableRow(task, columns) {
    var label = t("selectTask") + " " + task.gid + (task.name ? " (" + task.name + ")" : "");
    var cells = [el("td", { className: "pick" }, [
      el("input", { type: "checkbox", "data-action": "select", "aria-label": label, checked: state.selected.has(task.gid) })
    ])];
    columns.forEach(function (key) { cells.push(tableCell(key, task)); });
    return el("tr", { "data-gid": task.gid, "data-status": task.status }, cells);
  }

  function renderTable() {
    var columns = tableColumns();
    var head = el("tr", null, [el("th", { scope: "col", className: "pick" }, [el("span", { className: "visually-hidden", text: t("selectTask") })])]);
    TABLE_COLUMNS.forEach(function (column) {
      if (columns.indexOf(column[0]) === -1) { return; }
      var order = column[2];
      var th = el("th", { scope: "col", "data-column": column[0] });
      if (!order) { th.textContent = t(column[1]); head.appendChild(th); return; }
      // Created sorts both ways; the others as the API sorts them.
      var sorted = order === "newest" ? (state.orderBy === "newest" || state.orderBy === "oldest") : state.orderBy === order;
      var next = order === "newest" && state.orderBy === "newest" ? "oldest" : order;
      th.setAttribute("aria-sort", !sorted ? "none" : (state.orderBy === "oldest" || state.orderBy === "gid" ? "ascending" : "descending"));
      th.appendChild(el("button", { type: "button", className: "sort", "data-order": next, text: t(column[1]) }));
      head.appendChild(th);
    });
    var body = el("tbody");
    state.order.forEach(function (gid) { body.appendChild(renderTableRow(state.tasks.get(gid), columns)); });
    var table = $("task-table");
    table.textContent = "";
    table.appendChild(el("caption", { className: "visually-hidden", text: t("tasksTitle") }));
    table.appendChild(el("thead", null, [head]));
    table.appendChild(body);
    renderPager();
  }

  function updateTableRow(gid) {
    var row = document.querySelector('#task-table tr[data-gid="' + gid + '"]');
    var task = state.tasks.get(gid);
    if (!task) { if (row) { row.remove(); } return; }
    var fresh = renderTableRow(task, tableColumns());
    if (row) { keepFocus(row, fresh); row.replaceWith(fresh); return; }
    var body = document.querySelector("#task-table tbody");
    if (!body) { return; }
    var index = state.order.indexOf(gid);
    var after = index + 1 < state.order.length ? body.querySelector('tr[data-gid="' + state.order[index + 1] + '"]') : null;
    body.insertBefore(fresh, after);
  }

  function pageCount() {
    return typeof state.total === "number" ? Math.max(1, Math.ceil(state.total / state.pageSize)) : null;
  }

  // A page by its number is GET /api/tasks?page=N (an OFFSET: as cheap as
  // the first page up to here); a page past it is reached with Next.
  var MAX_PAGE_REACH = 100000;

  // pages null: the count is not known yet (a page from the address).
  function lastPageByNumber(pages) {
    var reach = Math.floor(MAX_PAGE_REACH / state.pageSize);
    return Math.max(1, pages === null ? reach : Math.min(pages || 1, reach));
  }

  function resetPages() {
    state.pageStarts = [];
    state.pageAt = null;
    state.pageNumber = 1;
  }

  // 1 … 4 5 6 … 60: the first, the last and the current page's neighbours.
  function pageNumbersShown(page, pages) {
    var shown = [];
    [1, page - 1, page, page + 1, pages].forEach(function (n) {
      if (n >= 1 && n <= pages && shown.indexOf(n) === -1) { shown.push(n); }
    });
    return shown.sort(function (a, b) { return a - b; });
  }

  function renderPager() {
    var pager = $("table-pager");
    pager.hidden = !state.tableView;
    if (!state.tableView) { return; }
    var page = state.pageNumber;
    var pages = pageCount();
    var hasNext = state.next !== null && state.next !== undefined;
    $("page-first").disabled = page === 1;
    $("page-prev").disabled = page === 1;
    $("page-next").disabled = !hasNext;
    var where = $("page-where");
    where.textContent = pages === null ? t("pageN", { page: num(page) }) : t("pageOf", { page: num(page), pages: num(Math.max(pages, page)) });
    where.setAttribute("data-page", String(page));
    var numbers = $("page-numbers");
    numbers.textContent = "";
    var reach = lastPageByNumber(pages);
    var last = 0;
    pageNumbersShown(page, Math.max(pages || 1, page)).forEach(function (n) {
      if (n !== page && n > reach) { return; }
      if (n > last + 1) { numbers.appendChild(el("span", { className: "gap", "aria-hidden": "true", text: "…" })); }
      last = n;
      var button = el("button", { type: "button", "data-page": String(n), "aria-label": t("pageN", { page: num(n) }), text: num(n) });
      if (n === page) { button.setAttribute("aria-current", "page"); }
      numbers.appendChild(button);
    });
    var input = $("page-go-number");
    input.max = String(reach);
    input.placeholder = num(page);
  }

  // to: "first", "prev", "next" or a page number; fromAddress: Back or
  // Forward asked for it (the address already says it).
  function turnPage(to, fromAddress) {
    if (to === "next") {
      if (state.next === null || state.next === undefined) { return; }
      state.pageStarts.push(state.pageAt);
      state.pageAt = { after: state.next };
      state.pageNumber += 1;
    } else if (to === "prev") {
      if (state.pageNumber <= 1) { return; }
      // The page before, as it was read; after a jump, by its number.
      state.pageAt = state.pageStarts.length ? state.pageStarts.pop() : (state.pageNumber > 2 ? { page: state.pageNumber - 1 } : null);
      state.pageNumber -= 1;
    } else if (typeof to === "number" && to > 1) {
      if (to === state.pageNumber) { return; }
      state.pageStarts = [];
      state.pageAt = { page: to };
      state.pageNumber = to;
    } else {
      resetPages();
    }
    if (!fromAddress) { writeHash(true); }
    resetListLoads();
    loadTasks(false).then(function () {
      var top = $("task-table");
      if (top && top.getBoundingClientRect().top < 0) { top.scrollIntoView(); }
    });
  }

  function onPageGo(event) {
    event.preventDefault();
    var input = $("page-go-number");
    var wanted = Math.floor(Number(asciiDigits(input.value)));
    if (!isFinite(wanted) || wanted < 1) { input.value = ""; return; }
    var target = Math.min(wanted, lastPageByNumber(pageCount()));
    input.value = "";
    turnPage(target);
  }

  // A fact on the row's second line: its label is for screen readers when
  // the value speaks for itself ("63 kB/s", "about 1 s left").
  function fact(label, value, role, quietLabel) {
    return el("div", { className: "fact" }, [
      el("dt", { className: quietLabel ? "visually-hidden" : null, text: label }),
      el("dd", { text: value, "data-role": role })
    ]);
  }

  function clock(value) {
    var d = F.toDate(value);
    if (!d) { return ""; }
    var sameDay = new Date().toDateString() === d.toDateString();
    return sameDay ? F.time(d, state.lang) : F.date(value, state.lang);
  }

  // The node's `detail` in the reader's words: known shapes mapped, the rest
  // shown as the node's own (English) text.
  var REASONS = [
    [/refused/i, "reasonRefused"], [/time(d)? ?out/i, "reasonTimeout"], [/unreachable|no route/i, "reasonUnreachable"],
    [/disk full|no space|ENOSPC/i, "reasonDiskFull"], [/reset|closed|lost/i, "reasonReset"],
    [/DNS|hostname|not known/i, "reasonDns"]
  ];
  function detailText(detail, saidAt) {
    var text = String(detail || "").trim();
    if (!text) { return null; }
    var reason = null;
    for (var i = 0; i < REASONS.length; i++) { if (REASONS[i][0].test(text)) { reason = t(REASONS[i][1]); break; } }
    var http = /HTTP (\d{3})/.exec(text);
    if (!reason && http) { reason = t("reasonHttp", { code: http[1] }); }
    var retry = /retry(?:ing)? in (\d+(?:\.\d+)?) ?s/i.exec(text);
    if (retry) {
      // "retrying in 0 s" says nothing: under a second is "in a moment".
      // The node said it when it reported (saidAt): the countdown ticks
      // from there (tickRetries), not frozen until the next report.
      var said = Date.parse(saidAt || "");
      var retryAt = (isNaN(said) ? Date.now() : Math.min(said, Date.now())) + Number(retry[1]) * 1000;
      return { text: retryText(retryAt, reason), raw: reason ? null : text, retryAt: retryAt, reason: reason };
    }
    if (reason) { return { text: reason, raw: null }; }
    return { text: state.lang === "en" ? text : t("reasonOther"), raw: state.lang === "en" ? null : text };
  }

  // "retrying in 12 s: the upstream refused the connection", as of now.
  function retryText(retryAt, reason) {
    var left = Math.max(0, (retryAt - Date.now()) / 1000);
    var soon = left < 1;
    var key = soon ? (reason ? "detailRetryingSoon" : "detailRetryingSoonNoReason") : (reason ? "detailRetrying" : "detailRetryingNoReason");
    return t(key, { n: F.duration(Math.ceil(left), state.lang), reason: reason });
  }

  // The admin's node panel knows each node's wire; a user's page does not.
  function nodeIsLegacy(id) {
    return !!id && (state.nodes || []).some(function (node) { return node.id === id && node.protocol === 1; });
  }

  function tickRetries() {
    var unreachable = 0;
    var cannotReach = [t("reasonRefused"), t("reasonUnreachable"), t("reasonDns"), t("reasonTimeout")];
    document.querySelectorAll("[data-retry-at]").forEach(function (span) {
      var reason = span.getAttribute("data-retry-reason") || null;
      span.textContent = retryText(Number(span.getAttribute("data-retry-at")), reason);
      if (reason && cannotReach.indexOf(reason) >= 0) { unreachable += 1; }
    });
    renderUpstreamBanner(unreachable);
  }

  // A site-wide banner while the upstream looks down: a create could not
  // reach it (for 10 minutes, or until a create gets through), or downloads
  // shown here cannot reach it and are retrying.
  var UPSTREAM_DOWN_MS = 10 * 60 * 1000;
  function noteUpstream(down) {
    state.upstreamDownAt = down ? Date.now() : null;
    tickRetries();
    if (state.signedIn) { loadUpstream(); }
  }

  // unreachable: the rows on this page that cannot reach it; the site's
  // count covers the rest (its last answer, every 15 s).
  function renderUpstreamBanner(unreachable) {
    var banner = $("upstream-banner");
    var site = state.upstream;
    if (site) { unreachable = Math.max(unreachable, Number(site.downloadsNotReaching) || 0); }
    var createDown = (!!state.upstreamDownAt && Date.now() - state.upstreamDownAt < UPSTREAM_DOWN_MS) || !!(site && site.since);
    var text = createDown ? t("upstreamDownCreate") : unreachable === 1 ? t("upstreamDownDownloadsOne")
      : unreachable > 1 ? t("upstreamDownDownloads", { n: num(unreachable) }) : "";
    if (banner.textContent !== text) { banner.textContent = text; }
    banner.hidden = !text || !state.signedIn;
  }

  // What the row says instead of speed and ETA when the numbers are not
  // live: queued, node offline, stalled, a delete waiting for a gone node.
  function rowNote(task) {
    var node = task.node;
    var offline = task.nodeConnected === false;
    // Offline since: when the node was last seen, else since this page saw it go.
    var since = offline && node && state.nodeSince.has(node) ? clock(state.nodeSince.get(node)) : "";
    if (task.status === "DELETE_PENDING" && node) {
      if (!offline) { return { kind: "wait", text: t("waitingNode", { node: node }) }; }
      return { kind: "offline", text: since ? t("waitingOfflineSince", { node: node, since: since }) : t("waitingOffline", { node: node }) };
    }
    if (task.status === "ARCHIVE_GONE") {
      var gone = task.archiveGone || {};
      return { kind: "gone", text: t("goneNote", { reason: goneReason(gone.reason) || "—", at: gone.at ? formatTime(gone.at) : "—" }) };
    }
    if (task.status === "COMPLETED" || task.status === "DELETE_FAILED" || task.status === "SUBMIT_UNKNOWN") { return null; }
    if (offline && node) {
      return { kind: "offline", text: since ? t("nodeOfflineSince", { node: node, since: since }) : t("nodeOffline", { node: node }) };
    }
    // Queued first: a task that waits its turn has not stalled, however long
    // it waits (the site gives stalledSince only to a moving download).
    if (task.queued) { return { kind: "queued", text: node ? t("queuedOn", { node: node }) : t("queuedWaiting") }; }
    if (task.stalledSince) { return { kind: "stalled", text: t("stalledSince", { since: clock(task.stalledSince) }) }; }
    return null;
  }

  function renderTask(task) {
    var percent = Math.round(Math.max(0, Math.min(1, Number(task.progress) || 0)) * 100);
    if (task.status === "COMPLETED") { percent = 100; }
    var label = statusLabel(task);
    var favorite = state.favorites.has(task.gid);
    var titleId = "task-title-" + task.gid;
    var note = rowNote(task);
    var detail = task.status === "COMPLETED" ? null : detailText(task.detail, task.updatedAt);

    var fill = el("div", { className: "bar-fill" });
    fill.style.width = percent + "%";  // CSSOM, allowed under the CSP (a style="" attribute is not)
    var bar = el("div", {
      className: "bar", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": 100,
      "aria-valuenow": percent, "aria-labelledby": titleId, "data-progress": percent
    }, [fill]);

    var favoriteText = favorite ? t("unfavorite") : t("favorite");
    var actions = el("div", { className: "task-actions" });
    if (task.status === "COMPLETED") {
      actions.appendChild(el("button", {
        type: "button", className: "download", "data-action": "download", disabled: state.archiveBusy.has(task.gid),
        "aria-busy": state.archiveBusy.has(task.gid) ? "true" : null,
        "aria-label": actionLabel(t("download"), task), text: t("download")
      }));
    }
    // Only its owner can get it again (an admin seeing another's task cannot).
    var mine = !task.owner || !state.me || task.owner === state.me.name;
    if (task.status === "ARCHIVE_GONE" && mine) {
      actions.appendChild(el("button", {
        type: "button", "data-action": "fetch-again",
        "aria-label": actionLabel(t("fetchAgain"), task), text: t("fetchAgain")
      }));
    }
    var detailsOpen = hasDetails(task) && state.detailsOpen.has(task.gid);
    if (hasDetails(task)) {
      actions.appendChild(el("button", {
        type: "button", "data-action": "details", "aria-expanded": detailsOpen ? "true" : "false",
        "aria-controls": detailsOpen ? "task-details-" + task.gid : null, "aria-label": actionLabel(t("details"), task), text: t("details")
      }));
    }
    if (task.status === "SUBMIT_UNKNOWN" && state.isAdmin) {
      actions.appendChild(el("a", {
        href: "#admin", className: "task-open", "data-reconcile": task.gid,
        "aria-label": actionLabel(t("taskReconcile"), task), text: t("taskReconcile")
      }));
    }
    actions.appendChild(el("a", {
      href: "#task/" + task.gid, className: "task-open", "data-action": "open",
      "aria-label": actionLabel(t("taskOpen"), task), text: t("taskOpen")
    }));
    if (canDelete(task)) {
      var deleteText = task.status === "DELETE_FAILED" ? t("retryDelete") : t("delete");
      actions.appendChild(el("button", {
        type: "button", className: "danger", "data-action": "delete",
        "aria-label": actionLabel(deleteText, task), text: deleteText
      }));
    }
    if (task.status === "DELETE_PENDING" && task.nodeConnected === false && state.isAdmin) {
      actions.appendChild(el("button", {
        type: "button", className: "danger", "data-action": "force-delete",
        "aria-label": actionLabel(t("forceDelete"), task), text: t("forceDelete")
      }));
    }

    var facts = [];
    var size = typeof task.size === "number" ? task.size : null;
    // Speed and ETA only while they are live: not for a queued task, an
    // offline node or a stalled download.
    var live = task.status === "DOWNLOADING" && !note && !detail;
    if (task.status === "DOWNLOADING" && size !== null) {
      facts.push(fact(t("downloaded"), t("bytesOf", { done: F.bytes(task.bytesDone || 0, state.lang), size: F.bytes(size, state.lang) }), "bytes", true));
    } else {
      facts.push(fact(t("size"), size === null ? "—" : F.bytes(size, state.lang), "bytes", true));
    }
    var unmeasured = (task.speed === null || task.speed === undefined) && (task.eta === null || task.eta === undefined);
    if (live && unmeasured) {
      // Not "— —": say why there are no numbers (a legacy node reports
      // progress only; any node's first report has no speed yet).
      facts.push(fact(t("speed"), t(nodeIsLegacy(task.node) ? "speedLegacy" : "speedNotYet"), "speed"));
    } else if (live) {
      facts.push(fact(t("speed"), F.speed(task.speed, state.lang), "speed", true));
      facts.push(fact(t("eta"), task.eta === null || task.eta === undefined ? "—" : F.eta(task.eta, state.lang), "eta", true));
    }
    if (state.isAdmin) { facts.push(fact(t("owner"), task.owner || "—", "owner")); }
    if (task.node && !note) { facts.push(fact(t("node"), task.node, "node")); }
    if (task.cost !== null && task.cost !== undefined) { facts.push(fact(t("cost"), t("costUnits", { n: num(task.cost) }), "cost", true)); }
    if (task.completedAt) { facts.push(fact(t("completedAt"), formatTime(task.completedAt), "completed")); }
    else if (task.createdAt) { facts.push(fact(t("created_at"), formatTime(task.createdAt), "created")); }

    var notes = [];
    if (note) { notes.push(el("span", { className: "row-note note-" + note.kind, "data-role": "note", "data-kind": note.kind, text: note.text })); }
    var archiveNote = state.archiveNotes.get(task.gid);
    if (archiveNote) {
      notes.push(el("span", { className: "row-note note-archive", "data-role": "archive-note", "data-code": archiveNote.code, text: archiveNote.describe() }));
    }
    if (detail) {
      notes.push(el("span", {
        className: "row-detail", "data-role": "detail", title: detail.raw || null, text: detail.text,
        "data-retry-at": detail.retryAt ? String(detail.retryAt) : null, "data-retry-reason": detail.retryAt ? detail.reason : null
      }));
      if (detail.raw) { notes.push(el("code", { className: "row-raw", lang: "en", text: detail.raw })); }
    }

    var selectLabel = actionLabel(t("selectTask"), task);
    return el("li", {
      className: "task" + (note ? " has-note note-" + note.kind : ""), "data-gid": task.gid, "data-status": task.status || "",
      "data-queued": task.queued ? "true" : null, "data-node-connected": task.nodeConnected === false ? "false" : null,
      // Whether the row's numbers move live (a running download, a node that answers).
      "data-live": task.status === "DOWNLOADING" || note ? (live ? "true" : "false") : null
    }, [
      el("input", { type: "checkbox", className: "select", "data-action": "select", "aria-label": selectLabel, checked: state.selected.has(task.gid) }),
      el("button", {
        type: "button", className: "star", "data-action": "favorite", "aria-pressed": favorite ? "true" : "false",
        "aria-label": actionLabel(favoriteText, task), title: favoriteText, text: favorite ? "★" : "☆"
      }),
      el("div", { className: "task-main" }, [
        el("div", { className: "task-head" }, [
          el("h3", { id: titleId, className: "task-title", text: taskName(task) }),
          el("span", { className: "gid", "data-role": "gid", text: "gid " + task.gid }),
          el("span", { className: "status status-" + String(task.status || "").toLowerCase() + (task.queued ? " status-queued" : ""), "data-role": "status", text: label })
        ]),
        el("dl", { className: "facts" }, notes.length ? [el("div", { className: "fact notes" }, notes)].concat(facts) : facts)
      ]),
      el("div", { className: "progress-row" }, [
        bar, el("span", { className: "percent", "aria-hidden": "true", text: percent + "%" }),
        el("span", { className: "stale-mark", "data-i18n": "staleMark", text: t("staleMark") })
      ]),
      actions,
      detailsOpen ? archiveDetails(task) : null
    ]);
  }

  // ---- archive: details, download, links for aria2 ------------------------------

  // Details are offered where there is an archive to describe (or one that went).
  function hasDetails(task) {
    return task.status === "COMPLETED" || !!task.archiveGone || typeof task.archiveSha256 === "string";
  }

  var GONE_REASONS = {
    EXPIRED: "goneExpired", DISK_BUDGET: "goneDiskBudget", CORRUPT: "goneCorrupt",
    MISSING: "goneMissing", CANCELLED: "goneCancelled", NODE_RETIRED: "goneRetired"
  };

  function goneReason(reason) {
    if (!reason) { return ""; }
    return GONE_REASONS[reason] ? t(GONE_REASONS[reason]) : String(reason);
  }

  // The archive as the node reported it: size on disk (readable and exact),
  // the SHA-256 with a Copy button, the node.  null is "not reported" (a
  // legacy node, or an archive completed before the site recorded them).
  function archiveDetails(task) {
    var rows = [];
    function item(label, role, children) {
      rows.push(el("div", { className: "detail" }, [el("dt", { text: label }), el("dd", { "data-role": role }, children)]));
    }
    function text(value) { return document.createTextNode(value); }
    var size = typeof task.archiveSize === "number" ? task.archiveSize : null;
    item(t("archiveSize"), "archive-size", [el("span", {
      className: size === null ? "not-reported" : null, "data-bytes": size === null ? null : String(size),
      text: size === null ? t("notReported") : t("archiveSizeValue", { human: F.bytes(size, state.lang), bytes: num(size) })
    })]);
    var sha = typeof task.archiveSha256 === "string" && task.archiveSha256 ? task.archiveSha256 : null;
    item(t("archiveSha256"), "archive-sha256", sha ? [
      el("code", { className: "sha256", lang: "en", "data-role": "sha256", text: sha }),
      text(" "),
      el("button", { type: "button", className: "copy", "data-action": "copy-sha", "aria-label": actionLabel(t("copySha"), task), text: t("copy") })
    ] : [el("span", { className: "not-reported", text: t("notReported") })]);
    item(t("archiveNode"), "archive-node", [text(task.node || "—")]);
    var gone = task.archiveGone;
    if (gone && typeof gone === "object") {
      item(t("archiveGoneFact"), "archive-gone", [text(t("archiveGoneValue", { reason: goneReason(gone.reason) || "—", at: gone.at ? formatTime(gone.at) : "—" }))]);
    }
    return el("div", { className: "task-details", id: "task-details-" + task.gid, "data-role": "details" }, [
      el("dl", { className: "details-list" }, rows)
    ]);
  }

  function toggleDetails(gid) {
    if (state.detailsOpen.has(gid)) { state.detailsOpen.delete(gid); } else { state.detailsOpen.add(gid); }
    rerenderRow(gid);
    var button = document.querySelector('#task-list > li[data-gid="' + gid + '"] button[data-action="details"]');
    if (button) { button.focus(); }
  }

  // The clipboard API where the page may use it, else a selected textarea
  // and execCommand("copy"); resolves to whether the text was copied.
  function copyText(value) {
    function fallback() {
      var box = el("textarea", { className: "copy-buffer", readonly: true, "aria-hidden": "true", tabindex: "-1" });
      box.value = value;
      document.body.appendChild(box);
      box.select();
      var copied = false;
      try { copied = document.execCommand("copy"); } catch (e) { copied = false; }
      box.remove();
      return copied;
    }
    if (navigator.clipboard && navigator.clipboard.writeText && window.isSecureContext) {
      return navigator.clipboard.writeText(value).then(function () { return true; }, fallback);
    }
    return Promise.resolve(fallback());
  }

  function copySha(gid, button) {
    var task = state.tasks.get(gid);
    var sha = task && task.archiveSha256;
    if (!sha) { return; }
    copyText(sha).then(function (copied) {
      if (document.contains(button)) { button.focus(); }
      if (copied) {
        notify(t("copied"));
        if (document.contains(button)) {
          button.textContent = t("copied");
          button.setAttribute("data-copied", "true");
          setTimeout(function () { button.textContent = t("copy"); button.removeAttribute("data-copied"); }, 2000);
        }
        return;
      }
      // Not copied: the hash is selected, ready for the reader's own copy.
      var code = button.parentNode && button.parentNode.querySelector('[data-role="sha256"]');
      if (code) { window.getSelection().selectAllChildren(code); }
      notify(t("copyFailed"), true);
    });
  }

  // Let the browser fetch ``url`` as a download: a node's signed link (it
  // answers with Content-Disposition: attachment, so the page stays) or the
  // site's own streaming path (same origin: the session cookie goes along).
  function saveFrom(url, name) {
    var link = el("a", { href: url, download: name || "", className: "visually-hidden", tabindex: "-1" });
    document.body.appendChild(link);
    link.click();
    link.remove();
  }

  // Why the archive could not be fetched, in the reader's words.
  function archiveErrorText(gid, result) {
    var code = errorCode(result);
    var err = (result.data && result.data.error) || {};
    if (result.status === 0) { return t("cannotReach"); }
    if (code === "archive_not_ready") { return t("archiveNotReady", { gid: gid }); }
    if (code === "archive_gone") {
      var reason = goneReason(err.reason || (err.archiveGone && err.archiveGone.reason));
      return reason ? t("archiveGone", { gid: gid, reason: reason }) : t("archiveGoneNoReason", { gid: gid });
    }
    if (code === "node_offline") {
      var wait = Number(result.retryAfter || err.retryAfter);
      return wait > 0 ? t("archiveNodeOffline", { gid: gid, n: F.duration(wait, state.lang) }) : t("archiveNodeOfflineNoN", { gid: gid });
    }
    if (code === "archive_not_served") { return t("archiveNotServed", { gid: gid }); }
    if (code === "too_many_streams") { return t("archiveTooMany"); }
    return errorSentence(result);
  }

  // Download: ask for a link first (JSON), so an offline node or a gone
  // archive is a sentence on the row, never an error page in the tab.
  function downloadArchive(gid) {
    if (state.archiveBusy.has(gid)) { return; }
    state.archiveBusy.add(gid);
    state.archiveNotes.delete(gid);
    rerenderRow(gid);
    api("GET", "/api/tasks/" + gid + "/archive").then(function (result) {
      state.archiveBusy.delete(gid);
      if (result.status === 401) { signOut(); notify(t("errUnauthorized"), true); return; }
      if (result.ok && result.data && result.data.url) {
        saveFrom(result.data.url);
        notify(t("downloadStarted", { gid: gid }));
      } else {
        // Worded when shown, so a change of language rewords it.
        var describe = function () { return archiveErrorText(gid, result); };
        state.archiveNotes.set(gid, { code: errorCode(result) || String(result.status), describe: describe });
        notify(describe(), true);
        // Not ready or gone: the row itself is out of date; read it again.
        if (result.status === 409 || result.status === 410) {
          api("GET", "/api/tasks/" + gid).then(function (fresh) {
            if (fresh.ok && fresh.data && fresh.data.task) { upsertTask(fresh.data.task); }
          });
        }
      }
      rerenderRow(gid);
    });
  }

  // POST /api/tasks/archive-links answered as text (an aria2 input file).
  function postForText(path, body) {
    return fetch(path, {
      method: "POST", headers: { "Accept": "text/plain", "Content-Type": "application/json" }, body: JSON.stringify(body)
    }).then(function (response) {
      return response.text().then(function (text) {
        var data = null;
        if (!response.ok && text) { try { data = JSON.parse(text); } catch (e) { data = null; } }
        siteAnswered();
        return { status: response.status, ok: response.ok, text: text, data: data };
      });
    }, function () {
      return { status: 0, ok: false, text: "", data: null };
    });
  }

  // Links through the site (via: site) that carry no credentials: a
  // session's file never holds its cookie, so aria2c needs the user's token.
  function siteLinks(text) {
    var own = location.origin + "/api/";
    var lines = text.split(/\r?\n/);
    return lines.filter(function (line, i) {
      if (line.indexOf(own) !== 0) { return false; }
      for (var j = i + 1; j < lines.length && /^\s/.test(lines[j]); j++) {
        if (/^\s+header=Authorization:/i.test(lines[j])) { return false; }
      }
      return true;
    }).length;
  }

  // The links in an aria2 input file: each unindented line that is not a comment.
  function countLinks(text) {
    return text.split(/\r?\n/).filter(function (line) { return line && !/^[\s#]/.test(line); }).length;
  }

  // "Links for aria2": one file for the completed tasks of the selection
  // (1,000 gids a request); the others are skipped and counted.
  function bulkLinks() {
    var chosen = state.order.filter(function (g) { return state.selected.has(g); });
    var completed = chosen.filter(function (g) { var task = state.tasks.get(g); return task && task.status === "COMPLETED"; });
    var skipped = chosen.length - completed.length;
    if (!completed.length) { showLinksResult({ kind: "warn", none: true, skipped: skipped }); return; }
    var button = $("bulk-links");
    button.disabled = true;
    showLinksResult({ kind: "", working: true });
    var texts = [];
    var chunks = [];
    for (var i = 0; i < completed.length; i += 1000) { chunks.push(completed.slice(i, i + 1000)); }
    chunks.reduce(function (chain, chunk) {
      return chain.then(function (failed) {
        if (failed) { return failed; }
        return postForText("/api/tasks/archive-links", { gids: chunk }).then(function (result) {
          if (!result.ok) { return result; }
          texts.push(result.text.replace(/\s+$/, ""));
          return null;
        });
      });
    }, Promise.resolve(null)).then(function (failed) {
      button.disabled = false;
      if (failed) {
        if (failed.status === 401) { signOut(); notify(t("errUnauthorized"), true); return; }
        showLinksResult({ kind: "error", failed: errorSentence(failed) });
        return;
      }
      var text = texts.filter(Boolean).join("\n") + "\n";
      var links = countLinks(text);
      if (links) { saveFrom(URL.createObjectURL(new Blob([text], { type: "text/plain" })), "tasknet-links.txt"); }
      showLinksResult({
        kind: links ? "ok" : "warn", links: links, skipped: skipped, missing: completed.length - links, none: !links,
        viaSite: siteLinks(text)
      });
    });
  }

  // The bulk links' outcome stays under the list bar (with how to use the
  // file) until the next one; it follows a change of language.
  function showLinksResult(outcome) {
    state.linksResult = outcome;
    renderLinksResult();
  }

  function renderLinksResult() {
    var box = $("links-result");
    var outcome = state.linksResult;
    box.textContent = "";
    box.className = "result links-result" + (outcome && outcome.kind ? " " + outcome.kind : "");
    box.hidden = !outcome;
    if (!outcome) { return; }
    if (outcome.working) { box.textContent = t("linksWorking"); return; }
    if (outcome.failed) { box.textContent = t("linksFailed", { message: outcome.failed }); return; }
    var parts = [];
    if (outcome.none) { parts.push(t("linksNone")); } else { parts.push(outcome.links === 1 ? t("linksSavedOne") : t("linksSaved", { n: num(outcome.links) })); }
    if (outcome.skipped) { parts.push(t("linksSkipped", { n: num(outcome.skipped) })); }
    if (outcome.missing) { parts.push(t("linksMissing", { n: num(outcome.missing) })); }
    box.appendChild(el("span", { "data-role": "links-outcome", text: parts.join(state.lang === "zh" ? "" : " ") }));
    if (!outcome.none) {
      // The command is code: split the sentence around it.
      var hint = el("span", { className: "links-hint", "data-role": "links-hint" });
      var words = t("linksHint").split("aria2c -i tasknet-links.txt");
      hint.appendChild(document.createTextNode(words[0]));
      if (words.length > 1) {
        hint.appendChild(el("code", { lang: "en", text: "aria2c -i tasknet-links.txt" }));
        hint.appendChild(document.createTextNode(words.slice(1).join("aria2c -i tasknet-links.txt")));
      }
      box.appendChild(hint);
    }
    if (outcome.viaSite) {
      var command = t("linksViaSiteCommand");
      var sentence = t("linksViaSite", { n: num(outcome.viaSite), command: "\u0001" }).split("\u0001");
      box.appendChild(el("span", { className: "links-hint", "data-role": "links-via-site" }, [
        document.createTextNode(sentence[0]), el("code", { lang: "en", text: command }),
        document.createTextNode(sentence.slice(1).join(""))
      ]));
    }
  }

  function canDelete(task) {
    // SUBMITTING and SUBMIT_UNKNOWN wait for the lifecycle or an admin;
    // DELETE_PENDING already waits for the node.
    return ["SUBMITTING", "SUBMIT_UNKNOWN", "DELETE_PENDING"].indexOf(task.status) === -1;
  }

  // ---- counts and the list's view ----------------------------------------------

  function loadCounts() {
    var path = "/api/tasks/counts" + (state.query ? "?q=" + encodeURIComponent(state.query) : "");
    return api("GET", path).then(function (result) {
      if (!result.ok || !result.data || !result.data.counts) { return; }
      state.counts = result.data.counts;
      renderCounts();
    });
  }

  // Pushes change counts; ask again at most once a second.
  function scheduleCounts() {
    if (state.countsTimer) { return; }
    state.countsTimer = setTimeout(function () { state.countsTimer = null; loadCounts(); }, 1000);
  }

  function tabCount(name) {
    var counts = state.counts || {};
    // QUEUED is a part of SUBMITTED: "All" does not count it twice, and
    // SUBMITTED_NOT_QUEUED (not a count of its own) is the rest.
    var keys = FILTERS[name] || Object.keys(counts).filter(function (key) { return key !== "QUEUED"; });
    return keys.reduce(function (sum, key) {
      if (key === "SUBMITTED_NOT_QUEUED") { return sum + Math.max(0, (Number(counts.SUBMITTED) || 0) - (Number(counts.QUEUED) || 0)); }
      return sum + (Number(counts[key]) || 0);
    }, 0);
  }

  function renderCounts() {
    Object.keys(FILTERS).forEach(function (name) {
      var node = document.querySelector('#status-tabs [data-count="' + name + '"]');
      if (node) { node.textContent = state.counts ? num(tabCount(name)) : ""; }
    });
    // The Queued tab once the site counts queued tasks apart (or the link asks for it).
    document.querySelector('#status-tabs [data-filter="queued"]').hidden = !queuedCounted() && state.filter !== "queued";
    renderShownCount();
  }

  function renderListControls() {
    document.querySelectorAll("#status-tabs button[data-filter]").forEach(function (button) {
      button.setAttribute("aria-pressed", button.getAttribute("data-filter") === state.filter ? "true" : "false");
    });
    $("task-order").value = state.orderBy;
    $("task-favorite").checked = state.favoriteOnly;
    if (state.nodeFilter) { noteNode(state.nodeFilter); }
    $("task-node").value = state.nodeFilter;
    $("task-page-size").value = String(state.pageSize);
  }

  // The view lives in the hash (#tasks?status=active&q=x&order=oldest), so a
  // reload or a shared link shows the same list in the same order.
  function readHash() {
    var hash = location.hash.replace(/^#/, "");
    var parts = hash.split("?");
    var view = parts[0] || "tasks";
    // A task's details: #task/GID (a deep link, with its own history entry).
    var taskMatch = /^task\/([0-9]{1,10})$/.exec(view);
    state.detailGid = taskMatch ? Number(taskMatch[1]) : null;
    if (taskMatch) { view = "task"; }
    state.wantedView = ["tasks", "charts", "admin", "task"].indexOf(view) === -1 ? "tasks" : view;
    // The list keeps its filters behind a task's page (Back returns to them).
    if (taskMatch) { state.view = view; return; }
    state.view = state.wantedView;
    var params = new URLSearchParams(parts[1] || "");
    var status = String(params.get("status") || "").toLowerCase();
    state.filter = FILTERS.hasOwnProperty(status) ? status : "all";
    state.query = asciiDigits(params.get("q") || "").trim().slice(0, 256);
    state.orderBy = ORDERS.indexOf(params.get("order")) === -1 ? "newest" : params.get("order");
    state.favoriteOnly = params.get("fav") === "1";
    state.nodeFilter = (params.get("node") || "").slice(0, 128);
    var size = Number(params.get("size"));
    state.pageSize = PAGE_SIZES.indexOf(size) === -1 ? PAGE_SIZE : size;
    // The table's page by its number (#tasks?page=30): a reload or a link
    // shows that page, Back and Forward walk the pages turned.
    var page = Math.floor(Number(asciiDigits(params.get("page") || "")));
    state.wantedPage = state.tableView && isFinite(page) && page > 1 ? Math.min(page, lastPageByNumber(null)) : 1;
  }

  // The page the address asks for, taken as the current one (loaded by the caller).
  function takeWantedPage() {
    resetPages();
    if (state.wantedPage > 1) {
      state.pageNumber = state.wantedPage;
      state.pageAt = { page: state.wantedPage };
    }
  }

  // push: a new entry in the browser's history (a view the person chose),
  // so Back and Forward walk through the views; otherwise the entry is replaced.
  function writeHash(push) {
    var params = new URLSearchParams();
    if (state.filter !== "all") { params.set("status", state.filter); }
    if (state.query) { params.set("q", state.query); }
    if (state.orderBy !== "newest") { params.set("order", state.orderBy); }
    if (state.favoriteOnly) { params.set("fav", "1"); }
    if (state.nodeFilter) { params.set("node", state.nodeFilter); }
    if (state.pageSize !== PAGE_SIZE) { params.set("size", String(state.pageSize)); }
    if (state.tableView && state.pageNumber > 1) { params.set("page", String(state.pageNumber)); }
    var text = params.toString();
    var hash = "#" + state.view + (state.view === "tasks" && text ? "?" + text : "");
    if (state.view === "task" && state.detailGid) { hash = "#task/" + state.detailGid; }
    if (location.hash === hash) { return; }
    if (push) { history.pushState(null, "", hash); } else { history.replaceState(null, "", hash); }
  }

  // The search box is the source of the query (a search still being typed
  // applies with a tab click too).
  // keepPage: the address's page stays the current one (Back or Forward
  // to another view of the list); any other change starts at page 1.
  function changeList(change, keepPage) {
    change();
    state.query = asciiDigits($("task-search").value).trim().slice(0, 256);
    state.selected.clear();
    state.selectMatching = false;
    if (keepPage) { takeWantedPage(); } else { resetPages(); }
    state.total = null;
    writeHash();
    renderListControls();
    state.next = null;
    state.order = [];
    resetListLoads();
    loadTasks(false);
  }

  // A new view (or signing out): the old view's loads are answered into nothing.
  function resetListLoads() {
    state.listSeq += 1;
    state.listBusy = null;
    state.listWant = { refresh: false, more: false };
  }

  // Admin is known only after /api/admin answers: until then a link to
  // #admin waits (nothing shown) instead of falling back to Tasks.
  function showView(view, asked) {
    if (asked !== false) { state.wantedView = view; }
    if (view === "admin" && !state.isAdmin) { view = state.adminKnown || !state.signedIn ? "tasks" : "pending"; }
    state.view = view === "pending" ? "admin" : view;
    document.querySelectorAll("[data-view-panel]").forEach(function (panel) {
      panel.hidden = panel.getAttribute("data-view-panel") !== view;
    });
    document.querySelectorAll("#nav a[data-view]").forEach(function (link) {
      if (link.getAttribute("data-view") === view) { link.setAttribute("aria-current", "page"); }
      else { link.removeAttribute("aria-current"); }
    });
    if (view === "charts" && state.signedIn) { loadCharts(); }
    if (view === "admin" && state.isAdmin) { loadNodes(); loadUnknown(); }
    if (view === "task" && state.signedIn && state.detailGid) { loadTaskDetails(state.detailGid); }
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

  // At most 20 rows a tick (rotating): a bulk delete of thousands must not
  // become thousands of requests every 5 s.
  function pollPending() {
    var pending = state.order.filter(function (gid) {
      var task = state.tasks.get(gid);
      return task && task.status === "DELETE_PENDING" && task.nodeConnected !== false;
    });
    var from = state.pollCursor = ((state.pollCursor || 0) + 20) % Math.max(1, pending.length);
    pending.slice(from, from + 20).forEach(function (gid) {
      api("GET", "/api/tasks/" + gid).then(function (result) {
        if (result.status === 404) { removeTask(gid); }
        else if (result.ok && result.data && result.data.task) { upsertTask(result.data.task); }
      });
    });
  }

  // ---- one task's details (#task/GID) ---------------------------------------------

  function loadTaskDetails(gid) {
    var box = $("task-page-body");
    $("task-page-title").textContent = t("taskTitle", { gid: gid });
    box.replaceChildren(el("p", { className: "hint", text: t("taskLoading") }));
    state.detailSeq = (state.detailSeq || 0) + 1;
    var seq = state.detailSeq;
    return api("GET", "/api/tasks/" + gid + "/details").then(function (result) {
      if (seq !== state.detailSeq || state.view !== "task") { return; }
      if (result.status === 404) { box.replaceChildren(el("p", { className: "empty", text: t("taskNotFound") })); return; }
      if (!result.ok) { box.replaceChildren(el("p", { className: "error", text: failureText("loadFailed", result) })); return; }
      state.detailData = result.data;
      renderTaskDetails();
    });
  }

  function renderTaskDetails() {
    var data = state.detailData;
    if (!data || !data.task || data.task.gid !== state.detailGid) { return; }
    var task = data.task;
    var op = data.operation || {};
    var box = $("task-page-body");
    var rows = [];
    function add(label, value, code) {
      if (value === null || value === undefined || value === "") { return; }
      rows.push(el("dt", { text: label }));
      rows.push(el("dd", {}, [code ? el("code", { text: String(value) }) : document.createTextNode(String(value))]));
    }
    $("task-page-title").textContent = t("taskTitle", { gid: task.gid }) + (task.name ? " · " + task.name : "");
    add(t("colStatus"), statusLabel(task));
    add(t("taskOwner"), task.owner);
    add(t("taskNode"), task.node);
    add(t("taskOperationId"), op.operationId || task.operationId, true);
    add(t("taskDeleteOperationId"), op.deleteOperationId || task.deleteOperationId, true);
    if (typeof (op.cost === undefined ? task.cost : op.cost) === "number") {
      var cost = op.cost === undefined ? task.cost : op.cost;
      add(t("taskCost"), t("taskCostPoints", { cost: num(cost) }) + " · " +
        (op.metered ? t("taskMetered", { week: op.meteredWeek || "" }) : t("taskNotMetered")));
    }
    add(t("taskCreatedAt"), formatTime(op.createdAt || task.createdAt));
    add(t("taskUpdatedAt"), formatTime(task.updatedAt));
    // In words; a step this page does not know is shown as stored.
    add(t("taskStep"), stepWords(op.step), !!op.step && !STEPS[op.step]);
    add(t("taskUnknownAt"), op.unknownAt ? formatTime(op.unknownAt) : null);
    add(t("taskError"), op.error);
    add(t("taskDeleteReason"), op.deleteReason);
    if (task.archiveGone) {
      add(t("archiveGoneFact"), t("taskArchiveGone", {
        reason: task.archiveGone.reason, at: formatTime(task.archiveGone.at), node: task.archiveGone.node || "—"
      }));
    }
    var parts = [el("dl", { className: "task-facts" }, rows)];
    if (task.status === "SUBMIT_UNKNOWN" && state.isAdmin) {
      parts.push(el("p", {}, [el("a", { href: "#admin", "data-reconcile": task.gid, id: "task-page-reconcile", text: t("taskReconcile") })]));
    }
    parts.push(el("h3", { text: t("historyTitle") }));
    var history = data.history || [];
    if (!history.length) { parts.push(el("p", { className: "empty", text: t("historyEmpty") })); }
    var list = el("ol", { className: "task-history", id: "task-history" });
    history.forEach(function (entry) {
      var words;
      if (entry.kind === "created") {
        words = typeof entry.cost === "number" ? t("historyCreatedCost", { cost: num(entry.cost) }) : t("historyCreated");
      } else if (entry.kind === "verdict") {
        words = t("historyVerdict", { actor: entry.actor, verdict: t(entry.verdict === "submitted" ? "verdictSubmitted" : "verdictNotSubmitted") });
      } else if (entry.kind === "forceDelete") {
        words = t("historyForceDelete", { actor: entry.actor, node: entry.node || "—" });
      } else {
        words = entry.status ? statusLabel({ status: entry.status }) : String(entry.state || "—");
        if (entry.node) { words += " · " + t("historyOnNode", { node: entry.node }); }
      }
      var why = [];
      if (entry.detail) { why.push(detailText(entry.detail, entry.at) || ""); }
      if (entry.note) { why.push(t("historyNote", { note: entry.note })); }
      if (entry.kind === "status" && entry.status === "SUBMIT_UNKNOWN" && op.error) { why.push(op.error); }
      list.appendChild(el("li", { "data-kind": entry.kind, "data-status": entry.status || entry.verdict || "" }, [
        el("time", { datetime: entry.at, text: formatTime(entry.at) }),
        el("span", { className: "history-what", text: words }),
        why.filter(Boolean).length ? el("span", { className: "history-why", text: why.filter(Boolean).join(" · ") }) : null
      ]));
    });
    if (history.length) { parts.push(list); }
    if (data.historyTruncated) { parts.push(el("p", { className: "hint", text: t("historyTruncated") })); }
    if (data.evidence) {
      parts.push(el("h3", { text: t("evidenceTitle") }));
      parts.push(el("pre", { className: "evidence", text: JSON.stringify(data.evidence, null, 2) }));
    }
    box.replaceChildren.apply(box, parts);
  }

  // ---- charts -------------------------------------------------------------------

  function loadCharts() {
    if (state.chartsTimer) { clearTimeout(state.chartsTimer); state.chartsTimer = null; }
    return api("GET", "/api/stats?window=" + chartWindow()).then(function (result) {
      // Redraw every 10 s while the charts are shown.
      if (state.view === "charts" && state.signedIn) {
        state.chartsTimer = setTimeout(function () { state.chartsTimer = null; loadCharts(); }, 10000);
      }
      if (!result.ok) { notify(failureText("loadFailed", result), true); return; }
      state.stats = result.data;
      renderCharts();
    });
  }

  var WINDOWS = { "900": "window15m", "3600": "window1h", "21600": "window6h", "86400": "window24h" };

  function chartWindow() {
    var value = $("charts-window").value;
    return WINDOWS[value] ? value : "3600";
  }

  function weekLabel(week) {
    var match = /^(\d{4})-W(\d{2})$/.exec(week || "");
    if (!match) { return String(week); }
    return state.lang === "zh" ? "第 " + Number(match[2]) + " 周" : "W" + Number(match[2]);
  }

  function shortWeekLabel(week) {
    var match = /^(\d{4})-W(\d{2})$/.exec(week || "");
    if (!match) { return String(week); }
    return state.lang === "zh" ? Number(match[2]) + "周" : String(Number(match[2]));
  }

  // A chart with nothing to draw says so instead of a flat line under "1 B/s".
  function chartEmpty(box, text) {
    box.textContent = "";
    box.appendChild(el("p", { className: "chart-empty", "data-role": "empty", text: text }));
  }

  function renderCharts() {
    var stats = state.stats;
    if (!stats || state.view !== "charts") { return; }
    var lang = state.lang;
    var seconds = stats.bucketSeconds || 60;
    var buckets = stats.buckets || [];
    var points = buckets.map(function (b) { return { t: F.toDate(b.start), v: (Number(b.bytes) || 0) / seconds }; });
    var total = buckets.reduce(function (sum, b) { return sum + (Number(b.bytes) || 0); }, 0);
    var completed = buckets.reduce(function (sum, b) { return sum + (Number(b.completed) || 0); }, 0);
    var peak = points.reduce(function (m, p) { return Math.max(m, p.v); }, 0);
    var period = t(WINDOWS[String(stats.window)] || "window1h");
    // The peak is of one bucket's average: 1 min over 1 h, 15 min over 24 h, so it says which.
    var minutes = Math.max(1, Math.round(seconds / 60));
    var bucket = minutes === 1 ? t("bucketMinute") : t("bucketMinutes", { n: num(minutes) });
    var label = t("chartThroughputLabel", { window: period, bytes: F.bytes(total, lang), peak: F.speed(peak, lang), bucket: bucket, completed: num(completed) });
    if (total > 0) {
      window.TasknetCharts.area($("chart-throughput"), {
        points: points, label: label,
        format: function (v) { return v > 0 ? F.speed(v, lang) : "0"; },
        time: function (d) { return F.time(d, lang); }
      });
      $("chart-throughput-summary").textContent = label;
    } else {
      chartEmpty($("chart-throughput"), t("chartEmpty", { window: period }));
      $("chart-throughput-summary").textContent = "";
    }

    // The top nodes of the window (at most stats.nodeLimit), then the rest as one bar.
    var perNode = (stats.nodes || []).map(function (id) {
      return { label: id, value: buckets.reduce(function (sum, b) { return sum + (Number((b.byNode || {})[id]) || 0); }, 0) };
    });
    if (Number(stats.otherNodes) > 0) {
      perNode.push({ label: t("chartOtherNodes", { n: num(stats.otherNodes) }), value: buckets.reduce(function (sum, b) { return sum + (Number(b.other) || 0); }, 0) });
    }
    var nodesBox = $("chart-nodes");
    if (perNode.length) {
      var nodesLabel = t("chartNodesLabel", { window: period, list: perNode.map(function (n) { return n.label + " " + F.bytes(n.value, lang); }).join(", ") });
      window.TasknetCharts.bars(nodesBox, { items: perNode, label: nodesLabel, format: function (v) { return F.bytes(v, lang); } });
      $("chart-nodes-summary").textContent = nodesLabel;
    } else {
      chartEmpty(nodesBox, t("chartNodesEmpty", { window: period }));
      $("chart-nodes-summary").textContent = "";
    }

    var usage = stats.usage || { weeks: [], quota: 0 };
    var weeks = usage.weeks || [];
    var current = weeks.length ? weeks[weeks.length - 1] : { used: 0 };
    var usageLabel = t("chartUsageLabel", { used: num(current.used), quota: num(usage.quota) });
    window.TasknetCharts.quota($("chart-usage"), {
      weeks: weeks, quota: Number(usage.quota) || 0, label: usageLabel,
      weekLabel: weekLabel, shortWeekLabel: shortWeekLabel, number: num,
      quotaLabel: t("quotaLine", { quota: num(usage.quota) })
    });
    $("chart-usage-summary").textContent = usageLabel;
  }

  // ---- create -------------------------------------------------------------

  // While the POST is out, say what is happening and for how long: a slow
  // upstream can hold it for the whole --upstream-timeout.
  function showCreating(started) {
    var seconds = Math.floor((Date.now() - started) / 1000);
    var result = $("create-result");
    result.textContent = t("creatingPhase", { n: F.duration(seconds, state.lang) });
    if (seconds >= 3) {
      var slow = state.upstreamTimeout ? t("creatingSlowN", { n: num(state.upstreamTimeout) }) : t("creatingSlow");
      result.appendChild(el("span", { className: "slow", text: slow }));
    }
  }

  function stopCreating() {
    if (state.createTimer) { clearInterval(state.createTimer); state.createTimer = null; }
  }

  function clearCreateResult() {
    var result = $("create-result");
    if (state.createTimer) { return; }  // still submitting: that message stays
    result.textContent = "";
    result.classList.remove("error", "ok", "warn");
    result.removeAttribute("data-outcome");
    result.removeAttribute("data-gid");
    result.removeAttribute("data-settled");
  }

  function onCreate(event) {
    event.preventDefault();
    var gidText = asciiDigits($("create-gid").value).trim();
    $("create-gid").value = gidText;
    var token = $("create-token").value.trim();
    var name = $("create-name").value.trim();
    var result = $("create-result");
    clearCreateResult();
    if (!/^[0-9]+$/.test(gidText) || Number(gidText) < 1 || Number(gidText) > 2147483647) {
      result.textContent = t("gidInvalid"); result.classList.add("error"); $("create-gid").focus(); return;
    }
    if (!token) {
      result.textContent = t("upstreamTokenMissing"); result.classList.add("error"); $("create-token").focus(); return;
    }
    var gid = Number(gidText);
    var body = { gid: gid, token: token };
    if (name) { body.name = name; }
    submitCreate(gid, body);
  }

  // The create POST and its answer in the form; a gone archive's charge is
  // asked for (with its cost) and, once accepted, the create is sent again.
  function submitCreate(gid, body) {
    var result = $("create-result");
    var button = $("create-submit");
    button.disabled = true;
    var started = Date.now();
    result.setAttribute("data-outcome", "pending");
    showCreating(started);
    state.createTimer = setInterval(function () { showCreating(started); }, 1000);
    api("POST", "/api/tasks", body).then(function (response) {
      if (response.status === 409 && errorCode(response) === "conflict") {
        return explainConflict(gid).then(function (key) { return [response, key]; });
      }
      return [response, null];
    }).then(function (pair) {
      var response = pair[0], conflict = pair[1];
      stopCreating();
      button.disabled = false;
      if (response.status === 409 && errorCode(response) === "charge_confirmation_required" && !body.confirmCharge) {
        confirmCharge(gid, body, response.data.error);
        return;
      }
      var params = { gid: gid, message: "", code: response.status };
      var outcome = createOutcome(response.status, errorCode(response));
      if (conflict) { outcome = { key: conflict.key, tone: "warn" }; params.status = conflict.status; params.owner = conflict.owner; }
      if (errorCode(response) === "already_completed") { outcome = { key: "createAlreadyCompleted", tone: "warn" }; }
      var err = (response.data && response.data.error) || {};
      if (outcome.key === "createQuota") {
        // The numbers: the answer's, else this week's usage as the site says now.
        var cost = err.cost !== undefined ? err.cost : (/costs (\d+)/.exec(err.message || "") || [])[1];
        var used = err.used !== undefined ? err.used : state.usage && state.usage.used;
        var quota = err.quota !== undefined ? err.quota : state.usage && state.usage.quota;
        if (used !== undefined && quota !== undefined) {
          var unsettled = Number(err.unsettled) || 0;
          outcome = { key: cost === undefined ? "createQuotaUsage" : unsettled > 0 ? "createQuotaUnsettled" : "createQuotaN", tone: "error" };
          params.cost = cost !== undefined ? t("costUnits", { n: num(cost) }) : ""; params.used = num(used); params.quota = num(quota);
          params.unsettled = num(unsettled);
        }
        loadUsage();
      }
      if (outcome.key === "createUnavailable" && (err.timeout || state.upstreamTimeout) && /time ?out|timed/i.test(err.message || "")) {
        outcome = { key: "createUnavailableN", tone: "error" }; params.n = num(err.timeout || state.upstreamTimeout);
      }
      if (outcome.key === "createRateLimited") {
        var wait = Number(err.retryAfter) || null;
        if (!wait) { outcome = { key: "createRateLimitedNoN", tone: "error" }; } else { params.n = num(wait); }
      }
      result.textContent = response.status === 0 ? t("cannotReach") : t(outcome.key, params);
      // The site's own words only where no sentence says it (English, under "Technical detail").
      if (outcome.raw && err.message) { result.appendChild(technical(err.message)); }
      result.classList.add(outcome.tone);
      result.setAttribute("data-outcome", String(response.status));
      result.setAttribute("data-gid", String(gid));
      if (response.ok) { noteUpstream(false); }
      else if (errorCode(response) === "upstream_unavailable") { noteUpstream(true); }
      if (conflict && conflict.key === "createConflictOther") {
        result.setAttribute("data-conflict", "other");
        $("create-gid").focus(); $("create-gid").select();
      } else {
        result.removeAttribute("data-conflict");
      }
      if (response.data && response.data.task) { upsertTask(response.data.task); }
      // A push may have said before this answer that the task moved on.
      if (response.status === 201) { settleCreateResult(state.tasks.get(gid)); }
      if (response.status === 201 || response.status === 202) {
        $("create-gid").value = ""; $("create-name").value = "";
        loadUsage();
        if (state.isAdmin && response.status === 202) { loadUnknown(); }
      }
      if (response.status === 401) { signOut(); notify(t("createUnauthorized"), true); }
      if (response.status === 0) { watchReach(); }
    });
  }

  function confirmCharge(gid, body, error) {
    var result = $("create-result");
    clearCreateResult();
    var cost = error && typeof error.cost === "number" ? t("costUnits", { n: num(error.cost) }) : "—";
    confirmDialog({
      title: t("chargeTitle"), text: t("chargeText", { gid: gid, cost: cost }), ok: t("chargeConfirm")
    }).then(function (answer) {
      if (!answer) {
        clearCreateResult();
        result.textContent = t("chargeDeclined", { gid: gid });
        result.classList.add("warn");
        result.setAttribute("data-outcome", "declined");
        result.setAttribute("data-gid", String(gid));
        return;
      }
      var again = { gid: body.gid, token: body.token, confirmCharge: true };
      if (body.name) { again.name = body.name; }
      submitCreate(gid, again);
    });
  }

  // A 409 says the gid has a task; whose?  The caller sees its own (an admin
  // sees all); another user's task answers 404 like a missing one.
  function explainConflict(gid) {
    return api("GET", "/api/tasks/" + gid).then(function (result) {
      var task = result.ok && result.data && result.data.task;
      if (!task) { return { key: "createConflictOther" }; }
      upsertTask(task);
      var status = statusLabel(task);
      if (state.isAdmin && task.owner) { return { key: "createConflictAdmin", status: status, owner: task.owner }; }
      return { key: "createConflictOwn", status: status };
    });
  }

  function createOutcome(status, code) {
    if (code === "rate_limited") { return { key: "createRateLimited", tone: "error" }; }
    if (code === "not_found") { return { key: "createNotFound", tone: "error" }; }
    if (code && ERROR_KEYS[code] && status >= 500 && status !== 502) { return { key: ERROR_KEYS[code], tone: "error" }; }
    switch (status) {
      case 201: return { key: "created", tone: "ok" };
      case 202: return { key: "createdUnknown", tone: "warn" };
      case 409: return { key: "createConflict", tone: "warn" };
      case 422: return { key: "createRejected", tone: "error", raw: true };
      case 429: return { key: "createQuota", tone: "error" };
      case 400: return { key: "createInvalid", tone: "error", raw: true };
      case 401: return { key: "createUnauthorized", tone: "error" };
      case 502: return { key: "createUnavailable", tone: "error" };
      default: return { key: "createFailed", tone: "error", raw: true };
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
      if (!result.ok) { notify(failureText("favoriteFailed", result), true); return; }
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
    // A verdict against the evidence: the dialog says so, and OK waits for a note.
    var warning = $("confirm-warning");
    warning.textContent = options.warning || "";
    warning.hidden = !options.warning;
    var note = $("confirm-note");
    var ok = $("confirm-ok");
    // aria-required, not required: constraint validation would block Cancel too.
    note.setAttribute("aria-required", options.noteRequired ? "true" : "false");
    note.setAttribute("aria-describedby", options.warning ? "confirm-warning" : "confirm-text");
    function gate() { ok.disabled = !!options.noteRequired && !note.value.trim(); }
    note.addEventListener("input", gate);
    gate();
    var opener = document.activeElement;
    return new Promise(function (resolve) {
      dialog.addEventListener("close", function onClose() {
        dialog.removeEventListener("close", onClose);
        note.removeEventListener("input", gate);
        ok.disabled = false;
        if (opener && document.contains(opener)) { opener.focus(); }
        var text = note.value.trim();
        var accepted = dialog.returnValue === "ok" && (!options.noteRequired || text);
        resolve(accepted ? { note: text } : null);
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
        notify(failureText("deleteFailed", result), true);
      });
    });
  }

  function onTaskListClick(event) {
    var button = event.target.closest("button[data-action]");
    if (!button) { return; }
    var gid = Number(button.closest("li[data-gid]").getAttribute("data-gid"));
    if (button.dataset.action === "favorite") { toggleFavorite(gid); }
    else if (button.dataset.action === "delete") { deleteTask(gid); }
    else if (button.dataset.action === "force-delete") { forceDelete(gid); }
    else if (button.dataset.action === "download") { downloadArchive(gid); }
    else if (button.dataset.action === "fetch-again") { fetchAgain(gid); }
    else if (button.dataset.action === "details") { toggleDetails(gid); }
    else if (button.dataset.action === "copy-sha") { copySha(gid, button); }
  }

  // A gone archive is fetched again by creating its gid again, with the
  // user's upstream token: the create form is filled and asks for it.
  function fetchAgain(gid) {
    var task = state.tasks.get(gid);
    clearCreateResult();
    $("create-gid").value = String(gid);
    if (task && task.name) { $("create-name").value = task.name; }
    var result = $("create-result");
    result.textContent = t("fetchAgainHint", { gid: gid });
    result.classList.add("warn");
    $("create-token").focus();
  }

  function onTaskListChange(event) {
    var box = event.target.closest('input[data-action="select"]');
    if (!box) { return; }
    var gid = Number(box.closest("li[data-gid]").getAttribute("data-gid"));
    if (box.checked) { state.selected.add(gid); } else { state.selected.delete(gid); state.selectMatching = false; }
    renderSelection();
  }

  // An admin completes a delete its offline node cannot confirm (audited, with a note).
  function forceDelete(gid) {
    var task = state.tasks.get(gid);
    if (!task) { return; }
    confirmDialog({
      title: t("forceTitle"), text: t("forceText", { gid: gid, node: task.node || "—" }),
      ok: t("forceDelete"), danger: true, note: true, noteRequired: true
    }).then(function (answer) {
      if (!answer) { return; }
      api("POST", "/api/admin/tasks/" + gid + "/force-delete", { note: answer.note }).then(function (result) {
        if (result.ok) {
          var view = result.data && result.data.task;
          if (view && !isGone(view)) { upsertTask(view); } else { removeTask(gid, { quiet: true, operationId: view ? view.operationId : undefined }); }
          notify(t("forced", { gid: gid }));
          loadUsage();
        } else {
          notify(t("forceFailed", { message: failureText("", result) }), true);
        }
      });
    });
  }

  // ---- live events ------------------------------------------------------------

  // While the socket is down, rows carry a stale mark (see style.css): their
  // bars and speeds are only as fresh as the last push.
  function setLive(on) {
    var live = $("live");
    if (on) { siteAnswered(); }
    live.setAttribute("data-state", on ? "online" : "offline");
    state.liveOn = on;
    renderLiveText();
    var stale = !on && !!state.signedIn;
    $("task-list").toggleAttribute("data-stale", stale);
    $("tasks-stale").hidden = !stale;
  }

  // "Live · node-1 offline": the updates are live, those rows are not.
  function renderLiveText() {
    var live = $("live");
    var on = !!state.liveOn;
    var offline = state.signedIn ? offlineNodes() : [];
    live.setAttribute("data-offline-nodes", offline.join(" "));
    var text = on ? t("liveOn") : t("liveOff");
    if (on && offline.length) {
      text += " · " + (offline.length <= 2 ? t("liveNodesOffline", { nodes: offline.join(", ") })
        : t("liveManyOffline", { n: num(offline.length) }));
    }
    live.textContent = state.signedIn ? text : "";
  }

  function connectEvents() {
    if (!state.signedIn) { return; }
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    // The browser sends the session cookie with the handshake.
    var socket = new WebSocket(scheme + location.host + "/api/events");
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
      scheduleUpstreamFor(message.task);
      if (row) { row.setAttribute("data-live-updates", String(Number(row.getAttribute("data-live-updates") || 0) + 1)); }
      if (state.isAdmin) {
        if (message.task.status === "SUBMIT_UNKNOWN") { loadUnknown(); }
        scheduleNodesRefresh();
      }
    };
    socket.onclose = function (event) {
      if (state.socket !== socket) { return; }
      state.socket = null;
      // 4001: the site closed it because the token was rotated or revoked.
      if (event.code === 4001) { signOut(); notify(t("createUnauthorized"), true); return; }
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
      var wasAdmin = state.isAdmin;
      state.isAdmin = result.ok;
      state.adminKnown = true;
      $("nav-admin").hidden = !result.ok;
      if (state.isAdmin !== wasAdmin) { renderTaskList(); }  // the owner column
      showView(state.wantedView, false);
      if (!result.ok) { return; }
      renderUnknown(result.data);
      loadNodes();
      loadUsers();
      if (!state.unknownTimer) {
        state.unknownTimer = setInterval(function () { loadNodes(); }, 10000);
      }
    });
  }

  function loadUnknown() {
    return api("GET", "/api/admin/unknown").then(function (result) {
      if (result.ok) { renderUnknown(result.data); }
      else { notify(failureText("loadFailed", result), true); }
    });
  }

  // task_operation.step, in words (storage: create.py, reconcile.py, delete.py).
  var STEPS = {
    reserve: "stepReserve", submit: "stepSubmit", persist: "stepPersist", recovery: "stepRecovery",
    recreate: "stepRecreate", resolved: "stepResolved", resolved_without_url: "stepResolvedWithoutUrl", deleted: "stepDeleted"
  };
  function stepWords(step) { return step && STEPS[step] ? t(STEPS[step]) : step; }
  var SOURCES = { submit: "sourceSubmit", audit: "sourceAudit" };

  // The stored error is the site's technical text (English); the reader gets
  // what it means in their language, the text itself under "Technical detail".
  function errorMeaning(text) {
    if (/timed? ?out|timeout/i.test(text)) { return t("errTimeout"); }
    if (/connection|closed|lost|refused|reset|never ?received|dropped/i.test(text)) { return t("errConnection"); }
    if (/HTTP 5\d\d/.test(text)) { return t("errServer"); }
    return t("errOther");
  }

  function technical(text) {
    return el("details", { className: "technical" }, [
      el("summary", { text: t("errDetail") }), el("code", { lang: "en", text: text })
    ]);
  }

  // The upstream's audit, the strongest evidence: its submission count, big.
  function auditBlock(upstream) {
    if (!upstream || !upstream.available) {
      return el("div", { className: "audit audit-missing", "data-role": "audit" }, [
        el("p", { className: "audit-count", text: t("auditMissing") }),
        upstream && upstream.error ? technical(upstream.error) : null
      ]);
    }
    var audit = upstream.audit || {};
    var n = Number(audit.submissions) || 0;
    var children = [el("p", { className: "audit-count" }, [
      el("strong", { className: "audit-number", "data-role": "audit-count", text: String(n) }),
      el("span", { text: " " + (n === 0 ? t("auditZero") : n === 1 ? t("auditCountOne") : t("auditCount")) })
    ])];
    if (audit.lastAt) { children.push(el("p", { className: "audit-last", text: t("auditLast", { at: formatTime(audit.lastAt) }) })); }
    return el("div", { className: "audit " + (n > 0 ? "audit-yes" : "audit-no"), "data-role": "audit", "data-submissions": n }, children);
  }

  function evidenceRows(task) {
    var evidence = task.evidence || {};
    var rows = [];
    function add(labelKey, value, extra) {
      rows.push(el("dt", { text: t(labelKey) }));
      rows.push(el("dd", { text: value }, extra ? [extra] : []));
    }
    if (evidence.step) { add("evStep", stepWords(evidence.step)); }
    if (evidence.unknownAt) { add("evAt", formatTime(evidence.unknownAt)); }
    if (evidence.error) { add("evError", errorMeaning(evidence.error), technical(evidence.error)); }
    if ("archiveUrlSource" in evidence || evidence.archiveUrl) {
      add("evArchiveUrlSource", SOURCES[evidence.archiveUrlSource] ? t(SOURCES[evidence.archiveUrlSource]) : t("sourceNone"));
    }
    if (evidence.archiveUrl) {
      rows.push(el("dt", { text: t("evArchiveUrl") }));
      rows.push(el("dd", {}, [el("code", { lang: "en", text: evidence.archiveUrl })]));
    }
    if (evidence.warning) { add("evWarning", t("noArchiveUrl")); }
    var operationId = evidence.operationId || task.operationId;
    if (operationId) {
      rows.push(el("dt", { text: t("evOperation") }));
      rows.push(el("dd", {}, [el("code", { text: operationId })]));
    }
    return rows;
  }

  // The verdicts the audit contradicts ({verdict: the site's English why});
  // such a verdict needs a note.
  function contradictionsOf(task) {
    var found = (task.evidence || {}).contradictions;
    return found && typeof found === "object" ? found : {};
  }

  // No audit to judge by (the upstream's audit could not be read): every
  // verdict needs a note, and no submission count may be shown as if read.
  function auditUnavailable(task) {
    var upstream = (task.evidence || {}).upstream;
    return !upstream || !upstream.available;
  }

  // What the audit says against ``verdict``, in the reader's language.
  function againstText(task, verdict) {
    if (auditUnavailable(task)) { return t("againstUnavailable"); }
    var upstream = (task.evidence || {}).upstream || {};
    var audit = upstream.audit || {};
    if (verdict === "submitted") { return t("againstNoPost"); }
    var n = Number(audit.submissions) || 0;
    if (audit.lastAt) { return t("againstPostsAt", { n: n, at: formatTime(audit.lastAt) }); }
    return t("againstPosts", { n: n });
  }

  // A reaped submission: "not submitted" only from evidence.notBefore.  The
  // site's own clock says how long is left (verdictWaitSeconds), so a wrong
  // browser clock neither enables the button early nor keeps it disabled.
  function verdictWaitBlock(task) {
    var evidence = task.evidence || {};
    if (!evidence.notBefore) { return null; }
    var waiting = Number(evidence.verdictWaitSeconds) > 0;
    return el("p", {
      className: "verdict-wait" + (waiting ? " verdict-wait-on" : ""), "data-role": "verdict-wait",
      "data-not-before": evidence.notBefore,
      text: t(waiting ? "verdictWait" : "verdictWaitOver", { at: formatTime(evidence.notBefore) })
    });
  }

  function renderUnknown(data) {
    setTimeout(focusReconcile, 0);  // after the rebuild (or none): a link asked for one card
    var list = $("unknown-list");
    var tasks = (data && data.tasks) || [];
    // Rebuild only when something a reader sees changed (the wait's countdown
    // alone does not): a rebuild under the reader's pointer loses their place.
    var shown = JSON.stringify(tasks, function (key, value) {
      return key === "verdictWaitSeconds" ? Number(value) > 0 : value;
    }) + "|" + state.lang;
    if (shown === state.unknownShown) { return; }
    state.unknownShown = shown;
    list.textContent = "";
    $("unknown-empty").hidden = tasks.length > 0;
    var soonest = null;
    tasks.forEach(function (task) {
      var evidence = task.evidence || {};
      var wait = Number(evidence.verdictWaitSeconds) || 0;
      if (wait > 0 && (soonest === null || wait < soonest)) { soonest = wait; }
      var against = contradictionsOf(task);
      var notes = Object.keys(against).map(function (verdict) {
        return el("p", { className: "contradiction", "data-role": "contradiction", "data-verdict": verdict,
          text: againstText(task, verdict) });
      });
      var notSubmittedLabel = t("actionLabel", { action: t("wasNotSubmitted"), gid: task.gid });
      var item = list.appendChild(el("li", { className: "unknown-item", "data-gid": task.gid }, [
        el("h3", { text: taskName(task) + " · gid " + task.gid }),
        auditBlock(evidence.upstream),
        verdictWaitBlock(task)
      ].concat(notes, [
        el("dl", { className: "evidence" }, evidenceRows(task)),
        el("div", { className: "task-actions" }, [
          el("button", { type: "button", "data-verdict": "submitted", className: "primary", text: t("wasSubmitted"),
            "aria-label": t("actionLabel", { action: t("wasSubmitted"), gid: task.gid }) }),
          el("button", { type: "button", "data-verdict": "not_submitted", text: t("wasNotSubmitted"),
            disabled: wait > 0, "data-not-before": wait > 0 ? evidence.notBefore : null,
            title: wait > 0 ? t("verdictWait", { at: formatTime(evidence.notBefore) }) : null,
            "aria-label": notSubmittedLabel })
        ])
      ])));
      item.taskData = task;
    });
    // Enable the button when the wait ends: the list is read again then.
    if (state.verdictTimer) { clearTimeout(state.verdictTimer); state.verdictTimer = null; }
    if (soonest !== null) {
      var delay = Math.min(soonest * 1000 + 250, 3600 * 1000);
      state.verdictTimer = setTimeout(function () { state.verdictTimer = null; loadUnknown(); }, delay);
    }
  }

  // A link to a task's reconcile card (its row, its details page) leads to
  // Admin; the card is brought into view and focused once it is listed.
  function focusReconcile() {
    if (!state.reconcileGid || state.view !== "admin") { return; }
    var item = $("unknown-list").querySelector('li[data-gid="' + state.reconcileGid + '"]');
    if (!item) { return; }
    state.reconcileGid = null;
    item.setAttribute("tabindex", "-1");
    item.classList.add("target");
    item.scrollIntoView({ block: "start" });
    item.focus();
  }

  function unknownTask(gid) {
    var item = $("unknown-list").querySelector('li[data-gid="' + gid + '"]');
    return item ? item.taskData : null;
  }

  function onUnknownClick(event) {
    var button = event.target.closest("button[data-verdict]");
    if (!button) { return; }
    var gid = Number(button.closest("li[data-gid]").getAttribute("data-gid"));
    var verdict = button.getAttribute("data-verdict");
    var submitted = verdict === "submitted";
    var task = unknownTask(gid);
    var against = task && contradictionsOf(task)[verdict] ? againstText(task, verdict) : null;
    confirmDialog({
      title: t(submitted ? "resolveSubmittedTitle" : "resolveNotSubmittedTitle"),
      text: t(submitted ? "resolveSubmittedText" : "resolveNotSubmittedText", { gid: gid }),
      ok: t(submitted ? "wasSubmitted" : "wasNotSubmitted"), note: true,
      // Said once: with no readable audit the note's reason is the whole warning
      // (the card's "could not be read" line would repeat it).
      warning: !against ? null : auditUnavailable(task) ? t("noteRequiredUnavailableText") : t("noteRequiredText") + " " + against,
      noteRequired: !!against
    }).then(function (answer) {
      if (!answer) { return; }
      var body = { verdict: verdict };
      if (answer.note) { body.note = answer.note; }
      api("POST", "/api/admin/tasks/" + gid + "/resolve", body).then(function (result) {
        if (result.ok) {
          notify(t("resolved", { gid: gid, verdict: t(submitted ? "verdictSubmitted" : "verdictNotSubmitted") }));
          // The create form's "outcome unknown" message about this gid is settled now.
          var createResult = $("create-result");
          if (createResult.getAttribute("data-gid") === String(gid)) { clearCreateResult(); }
          // "Not submitted" removes the task: its row goes, and a late push
          // of that generation (still UNKNOWN, or the gone view) is ignored.
          if (result.data && result.data.task) { upsertTask(result.data.task); } else { removeTask(gid, { quiet: true }); }
          loadUsage();
        } else if (result.status === 409 && errorCode(result) === "verdict_too_early") {
          notify(t("verdictTooEarly", { gid: gid, at: formatTime(result.data.error.notBefore) }), true);
        } else if (result.status === 409 && errorCode(result) === "note_required") {
          // The site's reason: the audit contradicts the verdict, or could not be read.
          var unreadable = /no readable evidence/.test(errorMessage(result) || "");
          notify(t(unreadable ? "noteRequiredUnavailable" : "noteRequired", { gid: gid, message: errorMessage(result) }), true);
        } else if (result.status === 409) {
          notify(t("resolveConflict", { gid: gid }), true);
        } else {
          notify(failureText("resolveFailed", result), true);
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
      state.nodes = Array.isArray(nodes) ? nodes : [];
      renderNodes();
      // The panel knows when a node was last seen: the rows of an offline node say it.
      state.nodes.forEach(function (node) {
        var up = node.connected !== false;
        var since = state.nodeSince.get(node.id);
        var flipped = setNodeUp(node.id, up, up ? null : node.lastSeenAt || null);
        if (flipped || (!up && since !== state.nodeSince.get(node.id))) { refreshNodeRows(node.id); }
      });
      scheduleLiveText();
    });
  }

  function refreshNodeRows(node) {
    markNodeRows(node);
    state.order.forEach(function (gid) {
      var task = state.tasks.get(gid);
      if (task && task.node === node && task.nodeConnected === false) { rerenderRow(gid); }
    });
  }

  var DROP_REASONS = { stale: "dropStale", old_generation: "dropOldGeneration", duplicate: "dropDuplicate", unknown_task: "dropUnknownTask" };

  function droppedText(dropped) {
    var reasons = Object.keys(dropped || {}).filter(function (k) { return Number(dropped[k]) > 0; });
    if (!reasons.length) { return "0"; }
    var total = reasons.reduce(function (sum, k) { return sum + Number(dropped[k]); }, 0);
    return total + " (" + reasons.map(function (k) {
      return (DROP_REASONS[k] ? t(DROP_REASONS[k]) : k) + " " + dropped[k];
    }).join(", ") + ")";
  }

  // A cell with a relative time ("3 s ago") the ticker keeps current.
  function agoCell(label, value, template) {
    var cell = el("td", { "data-label": label });
    if (!value) { cell.textContent = t("never"); return cell; }
    cell.setAttribute("data-ago", value);
    if (template) { cell.setAttribute("data-ago-template", template); }
    cell.setAttribute("title", formatTime(value));
    cell.textContent = agoText(cell);
    return cell;
  }

  function agoText(cell) {
    var ago = F.ago(cell.getAttribute("data-ago"), state.lang);
    var template = cell.getAttribute("data-ago-template");
    return template ? t(template, { ago: ago }) : ago;
  }

  function tickAgo() {
    document.querySelectorAll("[data-ago]").forEach(function (cell) { cell.textContent = agoText(cell); });
    tickRetries();
  }

  // A node's archives, bytes held and free space: what the node said of its
  // disk (disk), else what its last inventory counted (inventory, no free
  // space), else "—".
  function diskCells(node) {
    var disk = node.disk || null;
    var inventory = node.inventory || null;
    var from = disk && (disk.archives !== null || disk.bytes !== null) ? disk : inventory;
    var title = from === disk && disk ? t("diskFromNode", { at: formatTime(disk.at) })
      : from ? t("diskFromInventory", { at: formatTime(from.judgedAt) }) : null;
    var dash = function (v, fmt) { return typeof v === "number" ? fmt(v) : "—"; };
    var freeTitle = !disk ? null : typeof disk.budget === "number"
      ? t("diskBudget", { budget: F.bytes(disk.budget, state.lang) }) : t("diskNoBudget");
    return [
      el("td", { "data-label": t("nodeArchives"), "data-role": "archives", title: title, text: dash(from && from.archives, num) }),
      el("td", { "data-label": t("nodeBytesHeld"), "data-role": "held", title: title, text: dash(from && from.bytes, function (v) { return F.bytes(v, state.lang); }) }),
      el("td", { "data-label": t("nodeFree"), "data-role": "free", title: freeTitle, text: dash(disk && disk.free, function (v) { return F.bytes(v, state.lang); }) })
    ];
  }

  function renderNodes() {
    var nodes = state.nodes;
    var body = $("nodes-body");
    // A limit being typed survives the panel's refresh (and keeps its focus).
    var typed = {};
    body.querySelectorAll("input[data-node-limit]").forEach(function (input) {
      if (input.value !== input.defaultValue) {
        typed[input.getAttribute("data-node-limit")] = { value: input.value, focused: document.activeElement === input };
      }
    });
    body.textContent = "";
    nodes.forEach(function (node) {
      var connected = node.connected !== false;
      noteNode(node.id);
      var protocol = node.protocol === 1 ? t("legacy") : node.protocol === 2 ? t("v2") : "";
      // "4 running, 1,472 queued" once the site tells them apart.
      var hasSplit = typeof node.runningTasks === "number" || typeof node.queuedTasks === "number";
      var tasksText = hasSplit ? t("runningQueued", { running: num(node.runningTasks), queued: num(node.queuedTasks) })
        : node.activeTasks === undefined || node.activeTasks === null ? "—" : num(node.activeTasks);
      // An offline node runs nothing: what it holds, not "running" (issue 36, item 2).
      if (!connected && typeof node.activeTasks === "number") { tasksText = t("heldTasks", { n: num(node.activeTasks) }); }
      var controlText = nodeControlText(node);
      // One span for the dot and the words: on a phone the cell is a grid of
      // its label (::before) and one value.
      var stateCell = el("td", { "data-label": t("nodeState"), "data-role": "state" }, [
        el("span", {}, [
          el("span", { className: "dot", "aria-hidden": "true", text: "●" }),
          document.createTextNode((connected ? t("connected") : t("disconnected")) + (protocol ? " · " + protocol : "")),
          controlText ? el("span", { className: "node-control", "data-role": "control", text: " · " + controlText }) : null
        ])
      ]);
      body.appendChild(el("tr", { "data-node": node.id, "data-connected": connected ? "true" : "false", className: connected ? "" : "disconnected" }, [
        el("th", { scope: "row", text: node.id }),
        stateCell,
        el("td", { "data-label": t("nodeSite"), "data-role": "site", text: node.site || "—" }),
        el("td", { "data-label": t("activeTasks"), "data-role": "active", "data-running": hasSplit ? String(node.runningTasks) : null, "data-queued": hasSplit ? String(node.queuedTasks) : null, text: tasksText }),
        el("td", { "data-label": t("nodeSpeed"), "data-role": "speed", text: connected ? F.speed(node.bytesPerSecond, state.lang) : "—" }),
        agoCell(t("lastReport"), node.lastReportAt),
        el("td", { "data-label": t("droppedEntries"), "data-role": "dropped", text: droppedText(node.droppedEntries) }),
      ].concat(diskCells(node), [
        connected ? agoCell(t("connectedSince"), node.connectedAt, "connectedAgo") : agoCell(t("connectedSince"), node.lastSeenAt, "lastSeen"),
        nodeActionsCell(node)
      ])));
    });
    Object.keys(typed).forEach(function (id) {
      var input = body.querySelector('input[data-node-limit="' + CSS.escape(id) + '"]');
      if (!input) { return; }
      input.value = typed[id].value;
      if (typed[id].focused) { input.focus(); }
    });
    $("nodes-table").hidden = nodes.length === 0;
    $("nodes-empty").hidden = nodes.length > 0;
  }

  // An admin's custody actions on one node (DELIVERY.md "A node that is gone"),
  // each confirmed in a dialog that says what it does; audited with the note.
  // Drain, pause, resume and the download limit (issue 36, item 6) beside them.
  function nodeActionsCell(node) {
    var id = node.id;
    var control = node.control || null;
    var mode = control ? control.mode : "ACTIVE";
    var limit = control && typeof control.downloadLimit === "number" ? control.downloadLimit : null;
    function action(name, label, extra) {
      return el("button", Object.assign({ type: "button", "data-node-action": name, "data-node": id, "aria-label": t(label) + " " + id, text: t(label) }, extra || {}));
    }
    // Every other mode is one click away: drain, then pause, then resume.
    var modeButtons = mode === "ACTIVE" ? [action("drain", "drainNode"), action("pause", "pauseNode")]
      : [mode === "DRAINING" ? action("pause", "pauseNode") : action("drain", "drainNode"),
        action("resume", "resumeNode", { className: "primary" })];
    var limitInput = el("input", { type: "number", min: "1", max: "100000", step: "1", inputmode: "numeric", placeholder: t("noLimit"), value: limit === null ? "" : String(limit), "data-node-limit": id, "aria-label": t("nodeLimit") + " " + id });
    return el("td", { "data-label": t("nodeActions"), "data-role": "actions", className: "actions" }, modeButtons.concat([
      el("span", { className: "node-limit" }, [limitInput, action("limit", "setLimit", { "aria-label": t("nodeLimit") + " " + id + ": " + t("setLimit") })]),
      action("reassign", "reassignNode"),
      action("retire", "retireNode", { className: "danger" })
    ]));
  }

  // What an operator set on the node, in words: "draining, 12 left", "paused", "limit 4".
  function nodeControlText(node) {
    var control = node.control || null;
    if (!control) { return ""; }
    var parts = [];
    if (control.mode === "DRAINING") {
      var left = Number(node.activeTasks) || 0;
      parts.push(left > 0 ? t("modeDraining", { n: num(left) }) : t("modeDrained"));
    } else if (control.mode === "PAUSED") {
      parts.push(t("modePaused"));
    }
    if (typeof control.downloadLimit === "number") { parts.push(t("limitShown", { n: num(control.downloadLimit) })); }
    return parts.join(" · ");
  }

  var NODE_MODES = { drain: "DRAINING", pause: "PAUSED", resume: "ACTIVE" };

  function controlNode(button, id, name) {
    var body;
    var limitText = "";
    if (name === "limit") {
      var input = button.closest("td").querySelector("input[data-node-limit]");
      var raw = input.value.trim();
      var value = raw === "" ? null : Number(raw);
      if (value !== null && !(Number.isInteger(value) && value >= 1 && value <= 100000)) {
        notify(t("limitInvalid"), true);
        input.focus();
        return;
      }
      body = { downloadLimit: value };
      limitText = value === null ? t("noLimit") : num(value);
    } else {
      body = { mode: NODE_MODES[name] };
    }
    confirmDialog({
      title: t(name + "Title", { node: id, limit: limitText }),
      text: t(name + "Text", { node: id }),
      ok: t(name === "limit" ? "setLimit" : name + "Node"), note: true
    }).then(function (answer) {
      if (!answer) { return; }
      body.note = answer.note;
      api("POST", "/api/admin/nodes/" + encodeURIComponent(id) + "/control", body).then(function (result) {
        if (!result.ok) { notify(t("nodeActionFailed", { message: failureText("", result) }), true); return; }
        var done = result.data || {};
        var words = [done.mode === "DRAINING" ? t("modeDrainingShort") : done.mode === "PAUSED" ? t("modePaused") : t("modeActive")];
        words.push(typeof done.downloadLimit === "number" ? t("limitShown", { n: num(done.downloadLimit) }) : t("noLimit"));
        notify(t("nodeControlled", { node: id, what: words.join(" · ") }));
        loadNodes();
      });
    });
  }

  function onNodesClick(event) {
    var button = event.target.closest("button[data-node-action]");
    if (!button) { return; }
    var id = button.getAttribute("data-node");
    var name = button.getAttribute("data-node-action");
    if (name !== "reassign" && name !== "retire") { controlNode(button, id, name); return; }
    var retire = name === "retire";
    confirmDialog({
      title: t(retire ? "retireTitle" : "reassignTitle", { node: id }),
      text: t(retire ? "retireText" : "reassignText", { node: id }),
      ok: t(retire ? "retireNode" : "reassignNode"), danger: retire, note: true
    }).then(function (answer) {
      if (!answer) { return; }
      var path = "/api/admin/nodes/" + encodeURIComponent(id) + (retire ? "/retire" : "/reassign");
      api("POST", path, { note: answer.note }).then(function (result) {
        if (!result.ok) { notify(t("nodeActionFailed", { message: failureText("", result) }), true); return; }
        var done = result.data || {};
        notify(retire
          ? t("retired", { node: id, n: num(done.tasks), archives: num(done.archives) })
          : t("reassigned", { node: id, n: num(done.tasks), sent: num(done.sent), waiting: num(done.waiting) }));
        loadNodes();
      });
    });
  }

  // ---- admin: users (issue 36, item 8) ------------------------------------------

  var USER_NAME = /^[A-Za-z0-9_.-]{1,64}$/;
  var MAX_QUOTA = 1000000000;

  // The sign-in page names the demo token only on a site started with --demo.
  function showDemoHint() {
    api("GET", "/api/session").then(function (result) {
      $("demo-hint").hidden = !(result.ok && result.data && result.data.demo === true);
    });
  }

  function loadUsers() {
    return api("GET", "/api/admin/users").then(function (result) {
      if (!result.ok) { return; }
      state.users = (result.data && result.data.users) || [];
      renderUsers();
    });
  }

  function renderUsers() {
    var body = $("users-body");
    body.textContent = "";
    (state.users || []).forEach(function (user) {
      var me = !!(state.me && state.me.name === user.name);
      var disabled = !!user.disabledAt;
      var button = function (action, key, danger) {
        return el("button", { type: "button", className: danger ? "danger" : "", "data-user-action": action, "data-user": user.name, "aria-label": t(key) + " " + user.name, text: t(key) });
      };
      var quota = el("input", { type: "number", min: "0", max: String(MAX_QUOTA), step: "1", inputmode: "numeric", value: String(user.quota), "data-user-quota": user.name, "aria-label": t("userQuota") + " " + user.name });
      body.appendChild(el("tr", { "data-user": user.name, "data-disabled": disabled ? "true" : "false", className: disabled ? "disabled" : "" }, [
        el("th", { scope: "row", text: me ? t("userYou", { name: user.name }) : user.name }),
        el("td", { "data-label": t("userRole"), text: t(user.admin ? "roleAdmin" : "roleUser") }),
        el("td", { "data-label": t("userQuota"), className: "quota" }, [quota, button("quota", "userSaveQuota")]),
        el("td", { "data-label": t("userState"), "data-role": "user-state", text: disabled ? t("userDisabledSince", { at: formatTime(user.disabledAt) }) : t("userEnabled") }),
        el("td", { "data-label": t("userSessions"), "data-role": "sessions", text: num(user.sessions) }),
        el("td", { "data-label": t("userCreated"), text: formatTime(user.createdAt) }),
        el("td", { "data-label": t("userActions"), className: "actions" }, [
          disabled ? button("enable", "userEnable") : me ? null : button("disable", "userDisable", true),
          me ? null : button("token", "userRotate"),
          button("sessions", "userEndSessions")
        ])
      ]));
    });
    $("users-table").hidden = !(state.users || []).length;
  }

  // The API's refusal in the reader's language.
  function userFailure(result, name) {
    var message = errorMessage(result);
    if (/own account/.test(message)) { return t("userSelf"); }
    if (errorCode(result) === "conflict" && /already exists/.test(message)) { return t("userExists", { name: name }); }
    return t("userActionFailed", { message: failureText("", result) });
  }

  // A new token, shown once, in words the reader can copy.
  function showUserToken(name, token) {
    var box = $("user-token");
    box.textContent = "";
    if (!token) { box.hidden = true; return; }
    box.appendChild(el("span", { text: t("userTokenShown", { name: name }) + " " }));
    box.appendChild(el("code", { "data-role": "token", text: token }));
    box.hidden = false;
  }

  function quotaValue(text) {
    if (!/^\d+$/.test(text.trim())) { return null; }
    var value = Number(text.trim());
    return value <= MAX_QUOTA ? value : null;
  }

  function onAddUser(event) {
    event.preventDefault();
    var name = $("user-add-name").value.trim();
    var quotaText = $("user-add-quota").value.trim();
    var error = $("user-add-error");
    error.textContent = "";
    if (!USER_NAME.test(name)) { error.textContent = t("userNameInvalid"); $("user-add-name").focus(); return; }
    var body = { name: name, admin: $("user-add-admin").checked };
    if (quotaText) {
      var quota = quotaValue(quotaText);
      if (quota === null) { error.textContent = t("userQuotaInvalid"); $("user-add-quota").focus(); return; }
      body.quota = quota;
    }
    api("POST", "/api/admin/users", body).then(function (result) {
      if (!result.ok) { error.textContent = userFailure(result, name); return; }
      $("user-add-form").reset();
      notify(t("userAdded", { name: name }));
      showUserToken(name, result.data.token);
      loadUsers();
    });
  }

  function onUsersClick(event) {
    var button = event.target.closest("button[data-user-action]");
    if (!button) { return; }
    var name = button.getAttribute("data-user");
    var action = button.getAttribute("data-user-action");
    var path = "/api/admin/users/" + encodeURIComponent(name);
    var done = function (result, text) {
      if (!result.ok) { notify(userFailure(result, name), true); return; }
      notify(text(result.data || {}));
      loadUsers();
    };
    if (action === "quota") {
      var input = button.parentNode.querySelector("input[data-user-quota]");
      var quota = quotaValue(input.value);
      if (quota === null) { notify(t("userQuotaInvalid"), true); input.focus(); return; }
      api("PUT", path + "/quota", { quota: quota }).then(function (result) {
        done(result, function (data) { return t("userQuotaSaved", { name: name, quota: num(data.user.quota) }); });
      });
      return;
    }
    if (action === "enable") {
      api("POST", path + "/enable").then(function (result) {
        done(result, function () { return t("userEnabledDone", { name: name }); });
      });
      return;
    }
    var dialogs = {
      disable: { title: "userDisableTitle", text: "userDisableText", ok: "userDisable", danger: true },
      token: { title: "userRotateTitle", text: "userRotateText", ok: "userRotate" },
      sessions: { title: "userEndTitle", text: "userEndText", ok: "userEndSessions" }
    };
    var dialog = dialogs[action];
    if (!dialog) { return; }
    confirmDialog({
      title: t(dialog.title, { name: name }), text: t(dialog.text, { name: name }),
      ok: t(dialog.ok), danger: !!dialog.danger, note: false
    }).then(function (answer) {
      if (!answer) { return; }
      if (action === "disable") {
        api("POST", path + "/disable").then(function (result) {
          done(result, function (data) { return t("userDisabledDone", { name: name, n: num(data.sessionsEnded) }); });
        });
      } else if (action === "token") {
        api("POST", path + "/token").then(function (result) {
          done(result, function () { return t("userRotated", { name: name }); });
          if (result.ok) { showUserToken(name, result.data.token); }
        });
      } else {
        api("DELETE", path + "/sessions").then(function (result) {
          done(result, function (data) { return t("userSessionsEnded", { name: name, n: num(data.sessionsEnded) }); });
        });
      }
    });
  }

  // ---- language -----------------------------------------------------------------

  function applyLanguage() {
    document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
    document.querySelectorAll("[data-i18n]").forEach(function (node) { node.textContent = t(node.getAttribute("data-i18n")); });
    document.querySelectorAll("[data-i18n-placeholder]").forEach(function (node) { node.placeholder = t(node.getAttribute("data-i18n-placeholder")); });
    document.querySelectorAll("[data-i18n-label]").forEach(function (node) { node.setAttribute("aria-label", t(node.getAttribute("data-i18n-label"))); });
    var toggle = $("lang-toggle");
    // The toggle names the language it switches to, in that language.
    toggle.textContent = state.lang === "zh" ? "English" : "中文";
    toggle.setAttribute("lang", state.lang === "zh" ? "en" : "zh-CN");
    toggle.setAttribute("aria-label", state.lang === "zh" ? "Switch to English" : "切换到中文");
    if (state.usage) { renderUsage(state.usage); }
    renderWho();
    renderLinksResult();
    renderBulkResult();
    renderSelection();
    renderViewToggle();
    if (state.signedIn) {
      renderTaskList();
      setLive(state.socket !== null && state.socket.readyState === WebSocket.OPEN);
      renderCounts();
      renderCharts();
      if (state.isAdmin) { loadUnknown(); renderNodes(); }
    }
  }

  // The browser's language by default (navigator.languages, in order):
  // Chinese for a Chinese browser, otherwise English.
  function browserLanguage() {
    var list = (navigator.languages && navigator.languages.length) ? navigator.languages : [navigator.language || ""];
    for (var i = 0; i < list.length; i++) {
      if (/^zh\b/i.test(list[i])) { return "zh"; }
      if (/^en\b/i.test(list[i])) { return "en"; }
    }
    return "en";
  }

  function listenForViews() {
    readHash();
    takeWantedPage();
    $("task-search").value = state.query;
    renderListControls();
    showView(state.view);
    window.addEventListener("hashchange", function () {
      var key = function () { return [state.filter, state.query, state.orderBy, state.favoriteOnly, state.nodeFilter, state.pageSize].join("|"); };
      var before = key();
      readHash();
      $("task-search").value = state.query;
      renderListControls();
      showView(state.wantedView);
      if (key() !== before && state.signedIn) {
        changeList(function () {}, true);
      } else if (state.wantedPage !== state.pageNumber && state.signedIn && state.view === "tasks") {
        turnPage(state.wantedPage > 1 ? state.wantedPage : "first", true);
      }
    });
    $("status-tabs").addEventListener("click", function (event) {
      var button = event.target.closest("button[data-filter]");
      if (!button) { return; }
      changeList(function () { state.filter = button.getAttribute("data-filter"); });
    });
    var searchTimer = null;
    $("task-search").addEventListener("input", function () {
      if (searchTimer) { clearTimeout(searchTimer); }
      searchTimer = setTimeout(function () {
        searchTimer = null;
        if ($("task-search").value.trim().slice(0, 256) !== state.query) { changeList(function () {}); }
      }, 300);
    });
    $("task-order").addEventListener("change", function () {
      changeList(function () { state.orderBy = $("task-order").value; });
    });
    $("task-favorite").addEventListener("change", function () {
      changeList(function () { state.favoriteOnly = $("task-favorite").checked; });
    });
    $("task-node").addEventListener("change", function () {
      changeList(function () { state.nodeFilter = $("task-node").value; });
    });
    $("task-page-size").addEventListener("change", function () {
      changeList(function () { state.pageSize = Number($("task-page-size").value) || PAGE_SIZE; });
    });
    $("select-all").addEventListener("change", function () { selectAllShown($("select-all").checked); });
    $("bulk-delete").addEventListener("click", function () { bulkAction("delete"); });
    $("bulk-retry").addEventListener("click", function () { bulkAction("retry"); });
    $("bulk-links").addEventListener("click", bulkLinks);
    $("bulk-clear").addEventListener("click", function () { selectAllShown(false); state.selected.clear(); renderSelection(); });
    $("select-matching").addEventListener("click", selectMatching);
    $("create-gid").addEventListener("input", function () {
      var box = $("create-gid");
      var fixed = asciiDigits(box.value);
      if (fixed !== box.value) { box.value = fixed; }
    });
    $("charts-refresh").addEventListener("click", loadCharts);
    $("charts-window").addEventListener("change", loadCharts);
    // Notices last until the next action.
    ["click", "submit"].forEach(function (type) {
      $("app").addEventListener(type, function () { notify(""); }, true);
    });
    ["create-gid", "create-token", "create-name"].forEach(function (id) { $(id).addEventListener("input", clearCreateResult); });
    var resizeTimer = null;
    window.addEventListener("resize", function () {
      if (resizeTimer) { clearTimeout(resizeTimer); }
      resizeTimer = setTimeout(function () { resizeTimer = null; renderCharts(); }, 150);
    });
    setInterval(tickAgo, 1000);
  }

  // ---- start ----------------------------------------------------------------------

  function init() {
    var savedLang = localStorage.getItem(LANG_KEY);
    state.lang = savedLang === "en" || savedLang === "zh" ? savedLang : browserLanguage();
    state.tableView = localStorage.getItem(TABLE_KEY) === "table";
    applyLanguage();
    listenForViews();

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
    $("task-list").addEventListener("change", onTaskListChange);
    $("tasks-refresh").addEventListener("click", function () { loadTasks(false); loadUsage(); });
    $("tasks-more").addEventListener("click", function () { loadTasks(true); });
    $("view-cards").addEventListener("click", function () { setTableView(false); });
    $("view-table").addEventListener("click", function () { setTableView(true); });
    $("table-columns-list").addEventListener("change", onColumnChoice);
    $("page-first").addEventListener("click", function () { turnPage("first"); });
    $("page-prev").addEventListener("click", function () { turnPage("prev"); });
    $("page-next").addEventListener("click", function () { turnPage("next"); });
    $("page-numbers").addEventListener("click", function (event) {
      var button = event.target.closest("button[data-page]");
      if (button) { turnPage(Number(button.getAttribute("data-page"))); }
    });
    $("page-go").addEventListener("submit", onPageGo);
    $("task-table").addEventListener("click", function (event) {
      var sort = event.target.closest("button[data-order]");
      if (sort) { var order = sort.getAttribute("data-order"); changeList(function () { state.orderBy = order; }); }
    });
    $("task-table").addEventListener("change", function (event) {
      var box = event.target.closest('input[data-action="select"]');
      if (!box) { return; }
      var gid = Number(box.closest("tr[data-gid]").getAttribute("data-gid"));
      if (box.checked) { state.selected.add(gid); } else { state.selected.delete(gid); state.selectMatching = false; }
      renderSelection();
    });
    $("unknown-list").addEventListener("click", onUnknownClick);
    $("unknown-refresh").addEventListener("click", loadUnknown);
    $("nodes-refresh").addEventListener("click", loadNodes);
    $("nodes-body").addEventListener("click", onNodesClick);
    $("users-refresh").addEventListener("click", loadUsers);
    $("users-body").addEventListener("click", onUsersClick);
    $("user-add-form").addEventListener("submit", onAddUser);
    document.addEventListener("click", function (event) {
      var link = event.target.closest && event.target.closest("a[data-reconcile]");
      if (link) { state.reconcileGid = Number(link.getAttribute("data-reconcile")); setTimeout(focusReconcile, 0); }
    });
    $("nav").addEventListener("click", function (event) {
      var link = event.target.closest("a[data-view]");
      if (!link) { return; }
      event.preventDefault();
      showView(link.getAttribute("data-view"));
      writeHash(true);
    });

    localStorage.removeItem(OLD_TOKEN_KEY);
    showSignedIn(false);
    showDemoHint();
    resumeSession().then(function (outcome) {
      // No (valid) session cookie is simply "not signed in".
      if (!outcome.ok && !outcome.unauthorized) { $("sign-in-error").textContent = outcome.message; }
    });
  }

  init();
})();
