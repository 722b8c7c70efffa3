'use strict';
// The median of the numbers in xs, ignoring null, undefined and NaN; null when none.
// Shared by the bench reports (report.js, matrix/report.js, io-crowd.sh).
module.exports = function median(xs) {
  const v = xs.filter((x) => x !== null && x !== undefined && !Number.isNaN(x)).sort((a, b) => a - b);
  if (!v.length) return null;
  const m = v.length >> 1;
  return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
};
