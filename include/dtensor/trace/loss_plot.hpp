// dtensor/trace/loss_plot.hpp — loss curves as an SVG image, with no dependency.
//
//   trace::LossCurve train{"train", steps, losses}, val{"validation", eval_steps, eval_losses};
//   trace::write_loss_plot("loss.svg", {train, val});
//   std::string svg = trace::loss_plot_svg({train, val}, {.title = "GPT, dp 2 x tp 4"});
//
// One chart: axes with "nice" ticks (1, 2 or 5 times a power of ten) and a light grid, each
// curve a polyline (with a dot per point when it has few, such as a validation curve measured
// every 50 steps), and a legend naming the curves in order. Points whose step or loss is not
// finite (a diverged step) are left out. Any SVG viewer or browser shows the file; rsvg-convert
// or ImageMagick turn it into a PNG.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/core/error.hpp"
#include "dtensor/trace/text_file.hpp"

namespace dtensor::trace {

struct LossCurve {
  std::string label;
  std::vector<double> steps;   // x
  std::vector<double> losses;  // y, one per step
};

struct PlotOptions {
  int width = 720, height = 440;  // pixels, at least 240 x 160
  std::string title = "loss";
  std::string x_label = "step";
  std::string y_label = "loss";
};

namespace detail {

/// `text` with XML's five special characters escaped.
inline std::string xml_escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

/// A number as SVG coordinates and tick labels write it: "%.6g", or with `decimals` fixed.
inline std::string number_text(double v, int decimals = -1) {
  char buf[40];
  if (decimals < 0) std::snprintf(buf, sizeof buf, "%.6g", v);
  else std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

/// An axis: its range widened to whole ticks, the tick spacing, and the decimals its labels need.
struct Axis {
  double low = 0, high = 1, tick = 0.2;
  int decimals = 1;

  static Axis covering(double low, double high, int target_ticks) {
    if (!(low < high)) {  // one value (or none): a unit range around it
      const double middle = std::isfinite(low) ? low : 0.5;
      low = middle - 0.5;
      high = middle + 0.5;
    }
    const double raw = (high - low) / target_ticks;
    const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
    const double fraction = raw / magnitude;
    const double nice = fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10;
    Axis a;
    a.tick = nice * magnitude;
    a.low = std::floor(low / a.tick) * a.tick;
    a.high = std::ceil(high / a.tick) * a.tick;
    a.decimals = std::max(0, -int(std::floor(std::log10(a.tick) + 1e-9)));
    return a;
  }
  std::vector<double> ticks() const {
    std::vector<double> out;
    const long count = std::lround((high - low) / tick);
    for (long i = 0; i <= count; ++i) out.push_back(low + double(i) * tick);
    return out;
  }
};

inline constexpr const char* curve_colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

}  // namespace detail

/// The curves as one SVG document. Throws a dtensor::Error if a curve's steps and losses differ
/// in length or the size is below 240 x 160.
inline std::string loss_plot_svg(const std::vector<LossCurve>& curves, const PlotOptions& o = {}) {
  using detail::number_text;
  using detail::xml_escaped;
  if (o.width < 240 || o.height < 160)
    throw Error("trace::loss_plot_svg", dtensor::detail::cat("the plot is ", o.width, " x ", o.height,
                                                             " pixels; it needs at least 240 x 160"));
  double x_min = std::numeric_limits<double>::infinity(), x_max = -x_min, y_min = x_min, y_max = -x_min;
  for (const auto& c : curves) {
    if (c.steps.size() != c.losses.size())
      throw Error("trace::loss_plot_svg", dtensor::detail::cat("curve '", c.label, "' has ", c.steps.size(),
                                                               " steps but ", c.losses.size(), " losses"));
    for (std::size_t i = 0; i < c.steps.size(); ++i) {
      if (!std::isfinite(c.steps[i]) || !std::isfinite(c.losses[i])) continue;
      x_min = std::min(x_min, c.steps[i]);
      x_max = std::max(x_max, c.steps[i]);
      y_min = std::min(y_min, c.losses[i]);
      y_max = std::max(y_max, c.losses[i]);
    }
  }
  const auto x_axis = detail::Axis::covering(x_min, x_max, 8);
  const auto y_axis = detail::Axis::covering(y_min, y_max, 6);

  // The plot area, inside margins for the title, the tick labels and the axis labels.
  const double left = 70, right = o.width - 20.0, top = 40, bottom = o.height - 50.0;
  auto px = [&](double x) { return left + (x - x_axis.low) / (x_axis.high - x_axis.low) * (right - left); };
  auto py = [&](double y) { return bottom - (y - y_axis.low) / (y_axis.high - y_axis.low) * (bottom - top); };

  std::string svg = dtensor::detail::cat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", o.width,
      "\" height=\"", o.height, "\" viewBox=\"0 0 ", o.width, " ", o.height,
      "\" font-family=\"sans-serif\" font-size=\"12\">\n", "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      "<text x=\"", o.width / 2, "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">", xml_escaped(o.title),
      "</text>\n<g stroke=\"#dddddd\" stroke-width=\"1\">\n");
  for (double t : x_axis.ticks())
    svg += "<line x1=\"" + number_text(px(t)) + "\" y1=\"" + number_text(top) + "\" x2=\"" + number_text(px(t)) +
           "\" y2=\"" + number_text(bottom) + "\"/>\n";
  for (double t : y_axis.ticks())
    svg += "<line x1=\"" + number_text(left) + "\" y1=\"" + number_text(py(t)) + "\" x2=\"" + number_text(right) +
           "\" y2=\"" + number_text(py(t)) + "\"/>\n";
  svg += "</g>\n<g stroke=\"black\" stroke-width=\"1\">\n";
  svg += "<line x1=\"" + number_text(left) + "\" y1=\"" + number_text(bottom) + "\" x2=\"" + number_text(right) +
         "\" y2=\"" + number_text(bottom) + "\"/>\n";
  svg += "<line x1=\"" + number_text(left) + "\" y1=\"" + number_text(top) + "\" x2=\"" + number_text(left) +
         "\" y2=\"" + number_text(bottom) + "\"/>\n</g>\n<g>\n";
  for (double t : x_axis.ticks())
    svg += "<text x=\"" + number_text(px(t)) + "\" y=\"" + number_text(bottom + 16) + "\" text-anchor=\"middle\">" +
           number_text(t, x_axis.decimals) + "</text>\n";
  for (double t : y_axis.ticks())
    svg += "<text x=\"" + number_text(left - 6) + "\" y=\"" + number_text(py(t) + 4) + "\" text-anchor=\"end\">" +
           number_text(t, y_axis.decimals) + "</text>\n";
  svg += "<text x=\"" + number_text((left + right) / 2) + "\" y=\"" + number_text(o.height - 12.0) +
         "\" text-anchor=\"middle\">" + xml_escaped(o.x_label) + "</text>\n";
  svg += "<text x=\"16\" y=\"" + number_text((top + bottom) / 2) + "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " +
         number_text((top + bottom) / 2) + ")\">" + xml_escaped(o.y_label) + "</text>\n</g>\n";

  constexpr std::size_t colors = std::size(detail::curve_colors);
  constexpr std::size_t dotted_up_to = 60;  // points; more and the dots hide the line
  for (std::size_t k = 0; k < curves.size(); ++k) {
    const auto& c = curves[k];
    const char* color = detail::curve_colors[k % colors];
    std::string points, dots;
    std::size_t shown = 0;
    for (std::size_t i = 0; i < c.steps.size(); ++i) {
      if (!std::isfinite(c.steps[i]) || !std::isfinite(c.losses[i])) continue;
      const auto x = number_text(px(c.steps[i])), y = number_text(py(c.losses[i]));
      points += (points.empty() ? "" : " ") + x + "," + y;
      dots += "<circle cx=\"" + x + "\" cy=\"" + y + "\" r=\"2.5\"/>";
      ++shown;
    }
    svg += "<g class=\"curve\" data-label=\"" + xml_escaped(c.label) + "\" fill=\"" + color + "\">\n";
    svg += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"1.5\" points=\"" + points +
           "\"/>\n";
    if (shown <= dotted_up_to) svg += dots + "\n";
    svg += "</g>\n";
  }
  // The legend, top right inside the plot area.
  const double legend_x = right - 150, legend_y = top + 10;
  svg += "<g class=\"legend\">\n<rect x=\"" + number_text(legend_x) + "\" y=\"" + number_text(legend_y) +
         "\" width=\"140\" height=\"" + number_text(10 + 18.0 * double(curves.size())) +
         "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999999\"/>\n";
  for (std::size_t k = 0; k < curves.size(); ++k) {
    const double y = legend_y + 16 + 18.0 * double(k);
    svg += "<line x1=\"" + number_text(legend_x + 8) + "\" y1=\"" + number_text(y - 4) + "\" x2=\"" +
           number_text(legend_x + 32) + "\" y2=\"" + number_text(y - 4) + "\" stroke=\"" +
           detail::curve_colors[k % colors] + "\" stroke-width=\"2\"/>\n";
    svg += "<text x=\"" + number_text(legend_x + 38) + "\" y=\"" + number_text(y) + "\">" +
           xml_escaped(curves[k].label) + "</text>\n";
  }
  return svg + "</g>\n</svg>\n";
}

/// Writes loss_plot_svg(curves, o) to `path`; throws a dtensor::Error if it cannot.
inline void write_loss_plot(const std::string& path, const std::vector<LossCurve>& curves, const PlotOptions& o = {}) {
  detail::write_text_file(path, loss_plot_svg(curves, o), "trace::write_loss_plot");
}

}  // namespace dtensor::trace
