// dtensor/trace/all.hpp — every observability header: trace scopes and compute spans, the
// Chrome trace writer (and its MPI merge), unit spans, the progress bar, the loss plot, and
// the TrainingMonitor that bundles them for a trainer.
#pragma once

#include "dtensor/trace/chrome_trace.hpp"
#include "dtensor/trace/gather_trace.hpp"
#include "dtensor/trace/loss_plot.hpp"
#include "dtensor/trace/progress_bar.hpp"
#include "dtensor/trace/trace_scope.hpp"
#include "dtensor/trace/training_monitor.hpp"
#include "dtensor/trace/unit_spans.hpp"
