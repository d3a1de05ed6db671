/* Formatting for the web UI: sizes, speeds, durations, "3 s ago", dates.
 *
 * Pure functions of (value, lang); no DOM.  Dates use Intl.DateTimeFormat
 * with a medium date (a month name, so never ambiguous day-first/month-first)
 * in the browser's own English locale when the UI is English, zh-CN when it
 * is Chinese.
 */
window.TasknetFormat = (function () {
  "use strict";

  var UNITS = ["B", "kB", "MB", "GB", "TB"];

  var WORDS = {
    zh: {
      ago: "{n}前", justNow: "刚刚", left: "剩余约 {n}", perSecond: "{n}/s",
      s: "{n} 秒", min: "{n} 分钟", h: "{n} 小时", d: "{n} 天"
    },
    en: {
      ago: "{n} ago", justNow: "just now", left: "about {n} left", perSecond: "{n}/s",
      s: "{n} s", min: "{n} min", h: "{n} h", d: "{n} d"
    }
  };

  function words(lang) { return WORDS[lang] || WORDS.en; }

  function fill(text, n) { return text.replace("{n}", n); }

  // The locale Intl formats with: the browser's first English locale for the
  // English UI (en-US month-first, en-GB day-first, as that reader expects),
  // zh-CN for the Chinese UI.
  function locale(lang) {
    if (lang === "zh") { return "zh-CN"; }
    var list = (navigator.languages && navigator.languages.length) ? navigator.languages : [navigator.language || "en-US"];
    for (var i = 0; i < list.length; i++) {
      if (/^en\b/i.test(list[i])) { return list[i]; }
    }
    return "en-US";
  }

  function number(value, lang, digits) {
    return new Intl.NumberFormat(locale(lang), { maximumFractionDigits: digits === undefined ? 1 : digits }).format(value);
  }

  function isNumber(value) { return typeof value === "number" && isFinite(value); }

  function bytes(value, lang) {
    if (!isNumber(value) || value < 0) { return "—"; }
    var unit = 0;
    while (value >= 1000 && unit < UNITS.length - 1) { value /= 1000; unit += 1; }
    return number(value, lang, unit === 0 ? 0 : (value < 10 ? 1 : 0)) + " " + UNITS[unit];
  }

  function speed(value, lang) {
    if (!isNumber(value) || value <= 0) { return "—"; }
    return fill(words(lang).perSecond, bytes(value, lang));
  }

  function duration(seconds, lang) {
    var w = words(lang);
    if (!isNumber(seconds) || seconds < 0) { return "—"; }
    if (seconds < 60) { return fill(w.s, Math.max(0, Math.round(seconds))); }
    if (seconds < 3600) { return fill(w.min, Math.round(seconds / 60)); }
    if (seconds < 86400) { return fill(w.h, number(seconds / 3600, lang, 1)); }
    return fill(w.d, number(seconds / 86400, lang, 1));
  }

  function eta(seconds, lang) {
    if (!isNumber(seconds) || seconds < 0) { return "—"; }
    return fill(words(lang).left, duration(seconds, lang));
  }

  // ISO strings, epoch seconds or epoch milliseconds.
  function toDate(value) {
    if (value === null || value === undefined || value === "") { return null; }
    var date = typeof value === "number" ? new Date(value > 1e12 ? value : value * 1000) : new Date(value);
    return isNaN(date.getTime()) ? null : date;
  }

  function date(value, lang) {
    var parsed = toDate(value);
    if (!parsed) { return value === null || value === undefined ? "" : String(value); }
    return new Intl.DateTimeFormat(locale(lang), { dateStyle: "medium", timeStyle: "medium" }).format(parsed);
  }

  function time(value, lang) {
    var parsed = toDate(value);
    if (!parsed) { return ""; }
    return new Intl.DateTimeFormat(locale(lang), { hour: "numeric", minute: "2-digit" }).format(parsed);
  }

  function ago(value, lang, now) {
    var parsed = toDate(value);
    if (!parsed) { return "—"; }
    var seconds = ((now === undefined ? Date.now() : now) - parsed.getTime()) / 1000;
    if (seconds < 1) { return words(lang).justNow; }
    return fill(words(lang).ago, duration(Math.floor(seconds), lang));
  }

  return {
    locale: locale, number: number, bytes: bytes, speed: speed, duration: duration,
    eta: eta, toDate: toDate, date: date, time: time, ago: ago
  };
})();
