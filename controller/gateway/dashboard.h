// The dashboard the REST gateway serves at / (controller/gateway/dashboard.html, built in):
// workers, jobs with step/total and ETA, and the selected job's curves (Chart.js, served from
// Debian's libjs-chart.js at /static/chart.js; no CDN). The browser asks for the token once per
// session (HTTP Basic) and sends it with the page's calls.
#pragma once

namespace rlhfd::controller {

const char* DashboardPage();

// Where Debian's libjs-chart.js puts Chart.js.
inline constexpr char kChartJsPath[] = "/usr/share/javascript/chart.js/chart.min.js";

}  // namespace rlhfd::controller
