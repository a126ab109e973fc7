// gloo_allreduce.cc: the Gloo twin of `starling-bench ring`, for
// tools/bench/bench_ring.sh. One process per rank; Gloo's TCP transport
// (gloo::transport::tcp), rendezvous through a FileStore in a directory all
// ranks share, gloo::allreduce with AllreduceOptions::Algorithm::RING (the
// pipelined ring: reduce-scatter then all-gather, 1 MiB segments, two in
// flight, as gossip/ring.c) over S MiB of float32, summing.
//
// UNENCRYPTED: Gloo does not encrypt (Debian's libgloo has no TCP-TLS
// transport: GLOO_HAVE_TRANSPORT_TCP_TLS 0), so every figure here is for
// plaintext, against starling's authenticated encryption.
//
// Measured as starling-bench ring measures: the same data (the same
// generator as st__ring_fill in tools/bench/bench_ring_member.c, same seed), one
// warm-up round then R measured, each round after a barrier; a round's time
// is max(end) - min(start) over the ranks (CLOCK_MONOTONIC, one clock for
// every process on the machine); median, algbw = bytes / time,
// busbw = algbw * 2 (N - 1) / N. Every round's sum / N is checked against
// the float64 mean, with starling's bound (n + 4) 2^-24; exit 1 on a
// mismatch.
//
//   gloo_allreduce --rank R --size N --mib S --repeats K --store DIR
//                  [--host 127.0.0.1] [--seed 6] [--json]
//
// Build (tools/bench/bench_ring.sh does): g++ -O3 -std=c++17 gloo_allreduce.cc
// -o gloo_allreduce -lgloo -pthread
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// st__ring_fill, bit for bit.
void fill(uint64_t seed, uint32_t m, uint64_t first, uint64_t count,
          float* out) {
  uint64_t base = seed ^ ((uint64_t) (m + 1) * 0xd1b54a32d192ed03ull);
  for (uint64_t i = 0; i < count; i++) {
    uint64_t z = mix64(base + (first + i) * 0x9e3779b97f4a7c15ull);
    out[i] = (float) ((int32_t) (z >> 40) - (1 << 23)) * 0x1p-23f;
  }
}

void max_double(void* c, const void* a, const void* b, size_t n) {
  double* o = static_cast<double*>(c);
  const double* x = static_cast<const double*>(a);
  const double* y = static_cast<const double*>(b);
  for (size_t i = 0; i < n; i++)
    o[i] = std::max(x[i], y[i]);
}

// Element-wise max over the ranks, in place.
void allreduce_max(const std::shared_ptr<gloo::Context>& ctx,
                   std::vector<double>& v, uint32_t tag) {
  gloo::AllreduceOptions o(ctx);
  o.setOutput(v.data(), v.size());
  o.setReduceFunction(max_double);
  o.setTag(tag);
  gloo::allreduce(o);
}

int usage() {
  std::fprintf(stderr,
               "usage: gloo_allreduce --rank R --size N --mib S --repeats K "
               "--store DIR [--host ADDR] [--seed X] [--json]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1, size = 0;
  uint64_t mib = 16, repeats = 3, seed = 6;
  std::string store, host = "127.0.0.1";
  bool json = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    bool val = i + 1 < argc;
    if (a == "--rank" && val)
      rank = std::atoi(argv[++i]);
    else if (a == "--size" && val)
      size = std::atoi(argv[++i]);
    else if (a == "--mib" && val)
      mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--repeats" && val)
      repeats = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--seed" && val)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--store" && val)
      store = argv[++i];
    else if (a == "--host" && val)
      host = argv[++i];
    else if (a == "--json")
      json = true;
    else
      return usage();
  }
  if (size < 2 || rank < 0 || rank >= size || mib < 1 || repeats < 1 ||
      store.empty())
    return usage();
  const uint32_t n = (uint32_t) size;
  const uint64_t floats = mib * 1024 * 1024 / sizeof(float);

  // The reference: the float64 mean of every rank's data.
  std::vector<float> own(floats), data(floats), ref(floats), tmp(floats);
  fill(seed, (uint32_t) rank, 0, floats, own.data());
  {
    std::vector<double> acc(floats, 0.0);
    for (uint32_t m = 0; m < n; m++) {
      fill(seed, m, 0, floats, tmp.data());
      for (uint64_t i = 0; i < floats; i++)
        acc[i] += tmp[i];
    }
    for (uint64_t i = 0; i < floats; i++)
      ref[i] = (float) (acc[i] / n);
  }

  gloo::transport::tcp::attr attr;
  attr.hostname = host;
  attr.ai_family = AF_INET;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore fs(store);
  gloo::rendezvous::PrefixStore ps("ring", fs);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(std::chrono::seconds(120));
  ctx->connectFullMesh(ps, dev);

  const uint32_t rounds = (uint32_t) repeats + 1;
  std::vector<double> neg_start(rounds), end(rounds);
  double tol = (n + 4) * 0x1p-24, worst = 0;
  uint32_t tag = 1;
  for (uint32_t k = 0; k < rounds; k++) {
    std::memcpy(data.data(), own.data(), floats * sizeof(float));
    gloo::BarrierOptions b(ctx);
    b.setTag(tag++);
    gloo::barrier(b);
    double t0 = now();
    gloo::AllreduceOptions o(ctx);
    o.setOutput(data.data(), floats);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    o.setTag(tag++);
    gloo::allreduce(o);
    end[k] = now();
    neg_start[k] = -t0;
    for (uint64_t i = 0; i < floats; i++) {
      double e = std::fabs((double) data[i] / n - (double) ref[i]);
      if (!(e <= worst))
        worst = std::isnan(e) ? INFINITY : e;
    }
  }
  allreduce_max(ctx, neg_start, tag++);
  allreduce_max(ctx, end, tag++);
  std::vector<double> w{worst};
  allreduce_max(ctx, w, tag++);
  worst = w[0];
  if (!(worst <= tol)) {
    std::fprintf(stderr,
                 "gloo_allreduce: rank %d: WRONG RESULT, max |sum/N - mean| "
                 "%.3g > %.3g\n",
                 rank, worst, tol);
    return 1;
  }
  if (rank != 0)
    return 0;
  std::vector<double> t;
  for (uint32_t k = 1; k < rounds; k++)
    t.push_back(end[k] + neg_start[k]);
  std::sort(t.begin(), t.end());
  double med = t[t.size() / 2];
  double bytes = (double) mib * 1024 * 1024;
  double algbw = bytes * 8 / med / 1e9;
  double busbw = algbw * 2.0 * (n - 1) / n;
  if (json)
    std::printf(
        "{\"system\":\"gloo\",\"members\":%u,\"mib\":%llu,\"repeats\":%llu,"
        "\"encrypted\":false,\"algorithm\":\"ring\",\"seconds_median\":%.6f,"
        "\"seconds_min\":%.6f,\"seconds_max\":%.6f,\"algbw_gbps\":%.4f,"
        "\"busbw_gbps\":%.4f,\"verified\":true,\"max_abs_err\":%.3g}\n",
        n, (unsigned long long) mib, (unsigned long long) repeats, med,
        t.front(), t.back(), algbw, busbw, worst);
  else
    std::printf(
        "gloo ring all-reduce (TCP, UNENCRYPTED): %u ranks, %llu MiB float32: "
        "median %.2f ms (min %.2f, max %.2f), algbw %.3f Gbit/s, busbw %.3f "
        "Gbit/s; checked (max |err| %.2g)\n",
        n, (unsigned long long) mib, med * 1e3, t.front() * 1e3, t.back() * 1e3,
        algbw, busbw, worst);
  return 0;
}
