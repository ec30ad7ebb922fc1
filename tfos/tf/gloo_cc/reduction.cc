// The reduction server's data path, on a Gloo process group of W workers (ranks 0..W-1) and R
// reducers (ranks W..W+R-1), with Gloo's point-to-point send/recv (tfos.tf.reduction).
//
// A worker's all-reduce of n buffers (tfos_rs_allreduce, called by the TF kernel in op.cc): each
// buffer goes in pieces of piece_bytes, each piece in R shards whose sizes differ by at most one
// element (shard r of every piece goes to reducer r). To each reducer it first sends a header
// (magic, call number, number of shards) and the plan (elements, dtype, average per shard), then
// its shards; it receives every reduced shard back into the same memory. Everything is issued at
// once; Gloo's pairs move a shard only once the reducer has posted its receive, so each reducer
// paces its workers.
//
// A reducer (rs_serve) waits for the workers' headers, checks that every worker sent the same
// call and plan, and then, shard by shard, receives every worker's part (lookahead shards
// ahead), sums them in worker order (half and bfloat16 in float32) and sends the one sum to every
// worker: every worker gets the same bytes. No Python runs per message, and the GIL is released.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "torch_side.h"

namespace {

constexpr int64_t kMagic = 0x7f05524544ULL;  // "RED" after tfos's group key
constexpr int kHeaderTag = 0x7f51;
constexpr int kPlanTag = 0x7f52;
constexpr int kDataTag = 0x7f53;
// What a reducer accepts from a header and a plan before it allocates for them (a worker's shards
// are tfos.tf.reduction.SHARD_BYTES, 256 KiB).
constexpr int64_t kMaxShards = int64_t{1} << 20;
constexpr int64_t kMaxShardBytes = int64_t{16} << 20;

struct Reduction {
  c10::intrusive_ptr<c10d::Backend> pg;
  int workers = 0;
  int reducers = 0;
  std::vector<std::string> names;  // reducer r's name in errors (node, host)
  int64_t calls = 0;
  bool broken = false;  // a call failed: Gloo's pairs may still write into quarantined buffers
  std::string broken_by;  // the worker side's first failure, repeated by every later call
  std::mutex calls_mu;  // one call at a time: the reducers take the calls in the order they come
};

// apart from bridge.cc's handles
HandleRegistry<std::shared_ptr<Reduction>> reductions(int64_t{1} << 20, "reduction-server group");

// Waits for w within timeout_ms (0: the group's own timeout); throws with `who` first.
void wait_for(const c10::intrusive_ptr<c10d::Work>& w, int64_t timeout_ms, const std::string& who) {
  bool done = false;
  try {
    done = w->wait(std::chrono::milliseconds(timeout_ms));
  } catch (const std::exception& e) {
    throw std::runtime_error(who + ": " + e.what());
  }
  if (!done) throw std::runtime_error(who + ": no answer within " + std::to_string(timeout_ms / 1000.0) + " s");
}

}  // namespace

// A handle for a group whose first `workers` ranks are workers and whose other ranks are reducers
// (named in errors by `names`, one per reducer).
int64_t rs_register(c10::intrusive_ptr<c10d::Backend> pg, int workers, std::vector<std::string> names) {
  auto red = std::make_shared<Reduction>();
  red->pg = std::move(pg);
  red->workers = workers;
  red->reducers = red->pg->getSize() - workers;
  if (workers < 1 || red->reducers < 1) throw std::invalid_argument("a reduction-server group needs workers and reducers");
  names.resize(static_cast<size_t>(red->reducers));
  for (int r = 0; r < red->reducers; ++r) {
    if (names[r].empty()) names[r] = "reducer " + std::to_string(r);
  }
  red->names = std::move(names);
  return reductions.add(std::move(red));
}

void rs_unregister(int64_t handle) { reductions.remove(handle); }

// Worker side; see the file's comment. Returns 0; 1 with err set (no transfer left running on the
// buffers); 2 with err set when transfers may still touch the buffers (the caller must keep them
// alive for good: the group is broken).
int tfos_rs_allreduce(int64_t handle, int n, void* const* data, const void* const* copy_from,
                      const int64_t* counts, const int* types, const bool* average, int64_t piece_bytes,
                      int64_t timeout_ms, char* err, int errlen) {
  auto say = [&](const std::string& text) { std::snprintf(err, static_cast<size_t>(errlen), "%s", text.c_str()); };
  std::shared_ptr<Reduction> red;
  try {
    red = reductions.find(handle);
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
  std::lock_guard<std::mutex> one_call(red->calls_mu);
  if (red->broken) {
    say("an earlier all-reduce of this group failed (" + red->broken_by +
        "); its connections are not used again (restart the cluster)");
    return 1;
  }
  std::string bad;
  if (!known_types(n, types, &bad)) {
    say(bad);
    return 1;
  }
  const int W = red->workers, R = red->reducers;
  struct Shard {
    int buffer;
    int64_t offset, count;
  };
  // what each reducer gets, in order; kept alive until the sends end (leaked if a call fails)
  struct Plans {
    std::vector<std::vector<Shard>> shards;
    std::vector<std::vector<int64_t>> plan;
    std::vector<std::vector<int64_t>> header;
  };
  auto* plans = new Plans();
  plans->shards.resize(R);
  plans->plan.resize(R);
  plans->header.resize(R);
  std::vector<std::pair<int, size_t>> order;  // (reducer, shard) in the order they are issued
  for (int i = 0; i < n; ++i) {
    if (counts[i] == 0) continue;
    const int64_t item = static_cast<int64_t>(c10::elementSize(kTorchTypes[types[i]]));
    const int64_t piece = piece_bytes > 0 ? std::max<int64_t>(R, piece_bytes / item) : counts[i];
    for (int64_t off = 0; off < counts[i]; off += piece) {
      const int64_t len = std::min(piece, counts[i] - off);
      int64_t at = off;
      for (int r = 0; r < R; ++r) {
        const int64_t k = len / R + (r < len % R ? 1 : 0);
        if (k == 0) continue;
        plans->shards[r].push_back({i, at, k});
        plans->plan[r].insert(plans->plan[r].end(), {k, static_cast<int64_t>(types[i]), average[i] ? 1 : 0});
        order.emplace_back(r, plans->shards[r].size() - 1);
        at += k;
      }
    }
  }
  const int64_t call = red->calls++;
  std::vector<std::pair<int, c10::intrusive_ptr<c10d::Work>>> sends, recvs;  // (reducer, work)
  std::string failure;
  int with = -1;  // the reducer of the transfer being started or waited for: every failure names it
  try {
    for (int r = 0; r < R; ++r) {
      with = r;
      auto& h = plans->header[r];
      h = {kMagic, call, static_cast<int64_t>(plans->shards[r].size()), 0};
      std::vector<at::Tensor> ht{at::from_blob(h.data(), {4}, at::kLong)};
      sends.emplace_back(r, red->pg->send(ht, W + r, kHeaderTag));
      if (!plans->plan[r].empty()) {
        std::vector<at::Tensor> pt{
            at::from_blob(plans->plan[r].data(), {static_cast<int64_t>(plans->plan[r].size())}, at::kLong)};
        sends.emplace_back(r, red->pg->send(pt, W + r, kPlanTag));
      }
    }
    for (const auto& [r, k] : order) {
      with = r;
      const Shard& s = plans->shards[r][k];
      const int64_t item = static_cast<int64_t>(c10::elementSize(kTorchTypes[types[s.buffer]]));
      if (copy_from[s.buffer] != nullptr) {  // an input TF keeps: copied shard by shard, as it goes
        std::memcpy(static_cast<char*>(data[s.buffer]) + s.offset * item,
                    static_cast<const char*>(copy_from[s.buffer]) + s.offset * item, static_cast<size_t>(s.count * item));
      }
      std::vector<at::Tensor> part{blob(static_cast<char*>(data[s.buffer]) + s.offset * item, s.count, types[s.buffer])};
      sends.emplace_back(r, red->pg->send(part, W + r, kDataTag));
      recvs.emplace_back(r, red->pg->recv(part, W + r, kDataTag));
    }
    for (auto& [r, w] : recvs) {
      with = r;
      wait_for(w, timeout_ms, "no sum back");
    }
    for (auto& [r, w] : sends) {
      with = r;
      wait_for(w, timeout_ms, "a send not taken");
    }
  } catch (const std::exception& e) {
    // Gloo's own errors name an address at most: say which reducer it is (node, host)
    failure = (with >= 0 ? red->names[with] + " died or stopped answering: " : std::string()) + e.what();
  }
  if (!failure.empty()) {
    red->broken = true;  // plans leaked on purpose: sends may still read them
    red->broken_by = failure;
    say(failure);
    return 2;
  }
  delete plans;
  return 0;
}

// Reducer side; see the file's comment. Serves until the workers' connections end between two
// all-reduces (returns why), or throws when a call fails (a worker died or stalled within a call,
// the workers disagree). step_timeout_ms bounds every wait within a call; between calls a
// reducer waits as long as the group's own timeout.
std::string rs_serve(int64_t handle, int64_t step_timeout_ms, int lookahead) {
  auto red = reductions.find(handle);
  const int W = red->workers;
  auto& pg = red->pg;
  const int me = pg->getRank() - W;
  lookahead = std::max(1, lookahead);
  auto worker = [&](int w) { return "worker " + std::to_string(w) + " (rank " + std::to_string(w) + ")"; };
  // What a call receives into. If the call fails, receives may still be posted on these buffers:
  // they are then kept for good (leaked on purpose), never freed under Gloo.
  struct Flight {
    std::vector<std::vector<int64_t>> headers, plans;
    std::deque<std::vector<at::Tensor>> inputs;  // per shard in flight: one tensor per worker
    std::deque<std::vector<c10::intrusive_ptr<c10d::Work>>> arriving;
    std::deque<std::pair<at::Tensor, std::vector<c10::intrusive_ptr<c10d::Work>>>> leaving;
  };
  for (int64_t call = 0;; ++call) {
    auto flight = std::make_unique<Flight>();
    auto& headers = flight->headers;
    headers.assign(W, std::vector<int64_t>(4, 0));
    std::vector<c10::intrusive_ptr<c10d::Work>> hw;
    for (int w = 0; w < W; ++w) {
      std::vector<at::Tensor> t{at::from_blob(headers[w].data(), {4}, at::kLong)};
      hw.push_back(pg->recv(t, w, kHeaderTag));
    }
    for (int w = 0; w < W; ++w) {
      try {
        wait_for(hw[w], 0, worker(w));
      } catch (const std::exception& e) {  // between calls: the workers are done (or one died, and says so)
        red->broken = true;
        flight.release();
        return std::string("after ") + std::to_string(call) + " all-reduces, " + e.what();
      }
    }
    for (int w = 0; w < W; ++w) {
      if (headers[w][0] != kMagic || headers[w][1] != call || headers[w][2] != headers[0][2]) {
        red->broken = true;
        flight.release();
        throw std::runtime_error("reducer " + std::to_string(me) + ": " + worker(w) + " sent all-reduce #" +
                                 std::to_string(headers[w][1]) + " with " + std::to_string(headers[w][2]) +
                                 " shards where #" + std::to_string(call) + " with " + std::to_string(headers[0][2]) +
                                 " was due: the workers do not run the same collectives in the same order");
      }
    }
    const int64_t m = headers[0][2];
    if (m < 0 || m > kMaxShards) {
      red->broken = true;
      flight.release();
      throw std::runtime_error("reducer " + std::to_string(me) + ": a header of " + std::to_string(m) +
                               " shards (at most " + std::to_string(kMaxShards) + ")");
    }
    if (m == 0) continue;
    auto& plans = flight->plans;
    plans.assign(W, std::vector<int64_t>(static_cast<size_t>(3 * m)));
    try {
      std::vector<c10::intrusive_ptr<c10d::Work>> pw;
      for (int w = 0; w < W; ++w) {
        std::vector<at::Tensor> t{at::from_blob(plans[w].data(), {3 * m}, at::kLong)};
        pw.push_back(pg->recv(t, w, kPlanTag));
      }
      for (int w = 0; w < W; ++w) wait_for(pw[w], step_timeout_ms, worker(w));
      for (int w = 1; w < W; ++w) {
        if (plans[w] != plans[0]) {
          throw std::runtime_error(worker(w) + " split all-reduce #" + std::to_string(call) +
                                   " unlike worker 0: the workers reduce different tensors");
        }
      }
      for (int64_t k = 0; k < m; ++k) {
        const int64_t count = plans[0][3 * k], type = plans[0][3 * k + 1];
        if (type < 0 || type >= kTfosNumTypes || count < 1 || count > kMaxShardBytes ||
            count * static_cast<int64_t>(c10::elementSize(kTorchTypes[type])) > kMaxShardBytes) {
          throw std::runtime_error("a malformed plan from the workers (shard " + std::to_string(k) + ")");
        }
      }
      auto& inputs = flight->inputs;
      auto& arriving = flight->arriving;
      auto& leaving = flight->leaving;
      int64_t posted = 0;
      auto post = [&]() {
        const auto type = kTorchTypes[plans[0][3 * posted + 1]];
        std::vector<at::Tensor> ins;
        std::vector<c10::intrusive_ptr<c10d::Work>> ws;
        for (int w = 0; w < W; ++w) {
          ins.push_back(at::empty({plans[0][3 * posted]}, at::TensorOptions().dtype(type)));
          std::vector<at::Tensor> t{ins.back()};
          ws.push_back(pg->recv(t, w, kDataTag));
        }
        inputs.push_back(std::move(ins));
        arriving.push_back(std::move(ws));
        ++posted;
      };
      while (posted < std::min<int64_t>(m, lookahead)) post();
      for (int64_t k = 0; k < m; ++k) {
        for (int w = 0; w < W; ++w) wait_for(arriving.front()[w], step_timeout_ms, worker(w));
        std::vector<at::Tensor> ins = std::move(inputs.front());
        inputs.pop_front();
        arriving.pop_front();
        if (posted < m) post();
        const auto type = ins[0].scalar_type();
        const bool average = plans[0][3 * k + 2] != 0;
        const bool narrow = type == at::kHalf || type == at::kBFloat16;
        at::Tensor acc = narrow ? ins[0].to(at::kFloat) : ins[0];
        for (int w = 1; w < W; ++w) acc.add_(ins[w]);  // in worker order: the same bytes for everyone
        if (average && W > 1) {
          if (at::isFloatingType(acc.scalar_type())) {
            acc.mul_(1.0 / W);
          } else {
            acc.floor_divide_(W);
          }
        }
        at::Tensor out = narrow ? acc.to(type) : acc;
        std::vector<c10::intrusive_ptr<c10d::Work>> ws;
        for (int w = 0; w < W; ++w) {
          std::vector<at::Tensor> t{out};
          ws.push_back(pg->send(t, w, kDataTag));
        }
        leaving.emplace_back(out, std::move(ws));
        while (static_cast<int>(leaving.size()) > lookahead) {
          for (int w = 0; w < W; ++w) wait_for(leaving.front().second[w], step_timeout_ms, worker(w));
          leaving.pop_front();
        }
      }
      for (auto& [out, ws] : leaving) {
        for (int w = 0; w < W; ++w) wait_for(ws[w], step_timeout_ms, worker(w));
      }
    } catch (const std::exception& e) {
      red->broken = true;
      flight.release();
      throw std::runtime_error("reducer " + std::to_string(me) + ", all-reduce #" + std::to_string(call) + ": " +
                               e.what());
    }
  }
}
