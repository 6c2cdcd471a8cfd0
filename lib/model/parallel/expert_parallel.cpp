#include "model/parallel/expert_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <string>
#include <vector>

#include "util/error.h"

namespace fsdp::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x's rows to the ranks: send[r] rows (in order) to rank r; recv[r] rows come from rank r, rank-major.
at::Tensor exchange(const at::Tensor& x, const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                    const ExpertParallel& ep, const char* what) {
  int64_t total = 0;
  for (int64_t n : recv) total += n;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = total;
  const at::Tensor out = at::empty(shape, x.options());
  dist::ProcessGroup group = *ep.group;
  group.all_to_all(out, x.contiguous(), recv, send, what).wait();
  return out;
}

// The exchange as autograd sees it: its gradient goes back the way the rows came.
struct ExchangeRows : torch::autograd::Function<ExchangeRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const ExpertParallel* ep,
                            std::vector<int64_t> send, std::vector<int64_t> recv, bool back) {
    ctx->saved_data["ep"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(ep));
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["back"] = back;
    return exchange(
        x, send, recv, *ep,
        back ? "expert parallel: outputs back to their tokens" : "expert parallel: tokens to their experts");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* ep = reinterpret_cast<const ExpertParallel*>(static_cast<intptr_t>(ctx->saved_data["ep"].toInt()));
    const bool back = ctx->saved_data["back"].toBool();
    const at::Tensor g =
        exchange(grads[0], ctx->saved_data["recv"].toIntVector(), ctx->saved_data["send"].toIntVector(), *ep,
                 back ? "expert parallel: output gradients to the experts"
                      : "expert parallel: input gradients back to their tokens");
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor run_expert_parallel(const at::Tensor& rows, const at::Tensor& counts, const ExpertParallel& ep,
                               const LocalExperts& local) {
  const int64_t p = ep.size(), e = counts.numel();
  FSDP_CHECK(e % p == 0, "[model] ", e, " experts do not divide over parallelism_config_ep_size ", p);
  const int64_t l = e / p;
  // Every rank's rows for this rank's experts: recv (P, L), source rank by local expert.
  const at::Tensor send_counts = counts.to(at::kLong).contiguous();
  const at::Tensor recv_counts = at::empty_like(send_counts);
  dist::ProcessGroup group = *ep.group;
  group.all_to_all(recv_counts, send_counts, "expert parallel: rows per expert").wait();
  // The rows' all-to-all takes its split sizes on the host: one wait for the device a layer.
  const at::Tensor host = at::cat({send_counts, recv_counts}).to(at::kCPU);
  const int64_t* h = host.data_ptr<int64_t>();
  std::vector<int64_t> send(static_cast<size_t>(p), 0), recv(static_cast<size_t>(p), 0);
  int64_t received = 0;
  for (int64_t r = 0; r < p; ++r)
    for (int64_t k = 0; k < l; ++k) {
      send[static_cast<size_t>(r)] += h[r * l + k];
      recv[static_cast<size_t>(r)] += h[e + r * l + k];
      received += h[e + r * l + k];
    }
  // (R, C) by source rank, then by expert: regrouped by local expert, each expert's rows in source order.
  const at::Tensor in = ExchangeRows::apply(rows, &ep, send, recv, false);
  const at::Tensor segment_expert = at::arange(l, recv_counts.options()).repeat({p});         // (P L)
  const at::Tensor expert = at::repeat_interleave(segment_expert, recv_counts, 0, received);  // (R)
  const at::Tensor order = std::get<1>(expert.sort(/*stable=*/true, 0, false));
  const at::Tensor offsets = recv_counts.view({p, l}).sum(0).cumsum(0).to(at::kInt);
  const at::Tensor out = local(in.index_select(0, order), offsets, expert.index_select(0, order));
  const at::Tensor unsorted = at::empty_like(order).scatter_(0, order, at::arange(received, order.options()));
  return ExchangeRows::apply(out.index_select(0, unsorted), &ep, recv, send, true);
}

int64_t expert_parallel_forward_bytes(int64_t num_experts, int ep_size, int64_t rows_sent, int64_t rows_received,
                                      int64_t hidden, int64_t element_size) {
  if (ep_size <= 1) return 0;
  const int64_t counts = num_experts * 8 * (ep_size - 1) / ep_size;
  return counts + (rows_sent + rows_received) * hidden * element_size;
}

}  // namespace fsdp::model
