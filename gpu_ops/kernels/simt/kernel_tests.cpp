// Runs every kernel family under the SIMT emulator (emu.h) and compares it with a
// double-precision reference written from the formulas of the host twins
// (cpu_ops::{aggregate, attention, loss, sampler, dropout, link}, the relabel contract).
// Grids are kept at a few blocks so every grid- and warp-stride loop runs more than
// once. The host-side orchestration (scan levels, relabel steps, sampling counts →
// scan → pick) mirrors gpu_ops/src/cuda/{scan,sampling}.rs.
//
// Build and run: .ci/kernel-simt (g++ >= 12, -std=c++20 -pthread).
#include "emu.h"
// The kernel sources themselves, so declarations cannot drift from them.
#include "../math.cu"
#include "../features.cu"
#include "../scan.cu"
#include "../sample.cu"
#include "../aggregate.cu"
#include "../attention.cu"
#include "../link.cu"
#include <cstdio>
#include <cassert>
#include <map>
#include <set>
#include <random>
#include <numeric>

static std::mt19937_64 rng(42);
static int failures = 0;
#define CHECK(c, ...) do { if (!(c)) { std::printf("FAIL %s:%d: ", __FILE__, __LINE__); std::printf(__VA_ARGS__); std::printf("\n"); ++failures; } } while (0)
static float rnd() { return std::uniform_real_distribution<float>(-1, 1)(rng); }
static u64 below(u64 n) { return rng() % n; }
static bool close(double a, double b, double tol) { return std::fabs(a - b) <= tol * std::max(1.0, std::fabs(b)); }

// Grid shapes: a few blocks so grid-stride loops run more than once.
static unsigned BLOCKS = 2, T = 256;
static unsigned tgrid(u64 n) { return (unsigned)std::min<u64>((n + 255) / 256, BLOCKS); }
static unsigned wgrid(u64 n) { return (unsigned)std::min<u64>((n + 7) / 8, BLOCKS); }

// Mirrors gpu_ops/src/cuda/scan.rs: tiles of SCAN_TILE values, one block of
// SCAN_THREADS each; a single tile is one launch with null tile sums, more tiles
// add a scan of the tile sums and an add pass.
static unsigned scan_tiles(u64 n) { return (unsigned)((n + SCAN_TILE - 1) / SCAN_TILE); }
template <class U> void scan_in_place(std::vector<U>& buf, u64 n);
template <class U> void finish_scan(std::vector<U>& buf, u64 n, std::vector<U>& sums) {
    if (sums.empty()) return;
    scan_in_place<U>(sums, sums.size());
    if constexpr (sizeof(U) == 4) launch(scan_u32_add, tgrid(n), T, buf.data(), n, (const u32*)sums.data());
    else launch(scan_u64_add, tgrid(n), T, buf.data(), n, (const u64*)sums.data());
}
template <class U> void scan_in_place(std::vector<U>& buf, u64 n) {
    unsigned t = scan_tiles(n);
    std::vector<U> sums(t > 1 ? t : 0, (U)0xdead);
    U* ts = t > 1 ? sums.data() : nullptr;
    if constexpr (sizeof(U) == 4) launch(scan_u32_tiles, t, SCAN_THREADS, (const u32*)buf.data(), n, buf.data(), ts);
    else launch(scan_u64_tiles, t, SCAN_THREADS, (const u64*)buf.data(), n, buf.data(), ts);
    finish_scan<U>(buf, n, sums);
}

// Launches of one scan of n values (scan.rs's scan_launches).
static unsigned long long scan_launch_count(u64 n) { u64 t = (n + SCAN_TILE - 1) / SCAN_TILE; return t == 0 ? 0 : t == 1 ? 1 : 2 + scan_launch_count(t); }

static void test_scan() {
    const u64 tile = SCAN_TILE;
    for (u64 n : {0ull, 1ull, 5ull, 1023ull, 1025ull, tile - 1, tile, tile + 1, 5 * tile + 77, 1024ull * 1024 + 3}) {
        std::vector<u32> v(n + 1), want(n + 1);
        for (auto& x : v) x = below(5);
        v[n] = want[n] = 0xabcdu;  // past n: untouched
        u32 acc = 0;
        for (u64 i = 0; i < n; ++i) { want[i] = acc; acc += v[i]; }
        unsigned long long before = g_launches;
        scan_in_place<u32>(v, n);
        CHECK(v == want, "scan u32 n=%llu", n);
        CHECK(g_launches - before == scan_launch_count(n), "scan u32 n=%llu: %llu launches", n, g_launches - before);
        std::vector<u64> w(n + 1), w2(n + 1);
        for (auto& x : w) x = below(1ull << 40);
        w[n] = w2[n] = 0xabcdull;
        u64 a2 = 0;
        for (u64 i = 0; i < n; ++i) { w2[i] = a2; a2 += w[i]; }
        scan_in_place<u64>(w, n);
        CHECK(w == w2, "scan u64 n=%llu", n);
    }
    CHECK(scan_launch_count(tile) == 1 && scan_launch_count(tile + 1) == 3, "scan launch counts");
    std::printf("scan ok\n");
}

// Mirrors CudaBackend::relabel: `a` holds a.size() slots of which the first *live_a
// (when given) are targets, `b` likewise with *live_b; nothing is zeroed first
// (unique_flag_scan writes every rank); unique_scatter writes the four counts.
static void relabel(const std::vector<u32>& a, const std::vector<u32>& b, const u64* live_a, const u64* live, u64 unique_cap, std::vector<u32>& uniq, std::vector<u32>& local, u64 counts[4]) {
    u64 na = a.size(), nb = b.size(), total = na + nb;
    u64 cap = 64; while (cap < 2 * total) cap <<= 1;
    // One table: the keys, then the first positions (as the host allocates them).
    std::vector<u32> table(2 * (cap + 1), 0xffffffffu), slot(total, 0xdeadu), ranks(total + 1, 77);
    u32* keys = table.data(); u32* minp = table.data() + cap + 1;
    launch(unique_insert, tgrid(total), T, a.data(), na, live_a, b.data(), nb, live, keys, minp, cap, slot.data());
    unsigned t = scan_tiles(total + 1);
    std::vector<u32> sums(t > 1 ? t : 0, 0xdeadu);
    launch(unique_flag_scan, t, SCAN_THREADS, (const u32*)slot.data(), (const u32*)minp, na, live_a, nb, live, ranks.data(), t > 1 ? sums.data() : (u32*)nullptr);
    finish_scan<u32>(ranks, total + 1, sums);
    std::vector<u64> out(4, 99);
    uniq.assign(unique_cap, 0xabcdu); local.assign(nb, 0xabcdu);
    launch(unique_scatter, tgrid(std::max<u64>(total, 1)), T, a.data(), na, live_a, b.data(), nb, live, (const u32*)slot.data(), (const u32*)minp, (const u32*)ranks.data(), unique_cap, uniq.data(), local.data(), out.data());
    for (int i = 0; i < 4; ++i) counts[i] = out[i];
    uniq.resize(std::min<u64>(out[2], unique_cap));
}
static void relabel(const std::vector<u32>& a, const std::vector<u32>& b, const u64* live, std::vector<u32>& uniq, std::vector<u32>& local, u64 counts[4]) {
    relabel(a, b, nullptr, live, a.size() + b.size(), uniq, local, counts);
}

static void test_relabel() {
    const u64 tile = SCAN_TILE;
    for (auto [na, nb, range] : std::vector<std::tuple<u64, u64, u64>>{{0, 0, 4}, {0, 1, 4}, {1, 0, 4}, {0, 9, 4}, {17, 301, 90}, {200, 5000, 100000}, {3, 3000, 0}, {1, tile - 2, 3000}, {1, tile - 1, 3000}, {100, tile, 400000}, {7, 3 * tile, 50000}}) {
        std::vector<u32> pool(std::max<u64>(range, 1000));
        std::iota(pool.begin(), pool.end(), 0);
        std::shuffle(pool.begin(), pool.end(), rng);
        std::vector<u32> a(pool.begin(), pool.begin() + na), b(nb);
        if (range == 0) { a = {0xffffffffu, 0, 7}; for (auto& x : b) x = below(3) == 0 ? 0xffffffffu : (u32)below(50); }
        else for (auto& x : b) x = below(range);
        std::map<u32, u32> pos; std::vector<u32> wu, wl;
        for (u32 t : a) { pos[t] = wu.size(); wu.push_back(t); }
        for (u32 c : b) { auto it = pos.find(c); if (it == pos.end()) { pos[c] = wu.size(); wl.push_back(wu.size()); wu.push_back(c); } else wl.push_back(it->second); }
        std::vector<u32> u, l;
        u64 c[4];
        relabel(a, b, nullptr, u, l, c);
        CHECK(u == wu && l == wl, "relabel na=%llu nb=%llu (got %zu unique, want %zu)", na, nb, u.size(), wu.size());
        CHECK(c[0] == nb && c[1] == a.size() && c[2] == wu.size() && c[3] == a.size(), "relabel counts na=%llu nb=%llu: %llu %llu %llu %llu", na, nb, c[0], c[1], c[2], c[3]);
        // The same targets and candidates in buffers sized by bounds (garbage past
        // them: ids of the targets and new ones): only the live ones count.
        for (u64 extra : {1ull, 37ull, 3 * nb + 5}) {
            auto garbage = [&](std::vector<u32>& v, u64 k) { for (u64 q = 0; q < k; ++q) v.push_back(q % 2 ? (u32)below(1u << 31) : (a.empty() ? 5u : a[q % a.size()])); };
            std::vector<u32> bb = b; garbage(bb, extra);
            u64 live = nb;
            std::vector<u32> ub, lb;
            relabel(a, bb, &live, ub, lb, c);
            bool same = ub == wu && std::equal(wl.begin(), wl.end(), lb.begin());
            for (u64 q = nb; q < bb.size(); ++q) same &= lb[q] == 0xabcdu;  // past the live: unwritten
            CHECK(same, "bounded relabel na=%llu nb=%llu extra=%llu", na, nb, extra);
            CHECK(c[0] == nb && c[1] == a.size() && c[2] == wu.size(), "bounded relabel counts na=%llu nb=%llu extra=%llu", na, nb, extra);
            // Targets bounded too (a device-counted frontier), and a unique
            // capacity exactly the unique count: the same result.
            std::vector<u32> ab = a; garbage(ab, extra % 11 + 1);
            u64 live_a = na;
            relabel(ab, bb, &live_a, &live, wu.size(), ub, lb, c);
            same = ub == wu && std::equal(wl.begin(), wl.end(), lb.begin());
            CHECK(same && c[0] == nb && c[1] == na && c[2] == wu.size() && c[3] == na, "relabel of bounded targets na=%llu nb=%llu extra=%llu", na, nb, extra);
        }
        // A unique capacity below the unique count: the count tells, nothing is
        // written beyond.
        if (wu.size() > 1) {
            std::vector<u32> ub, lb;
            relabel(a, b, nullptr, nullptr, wu.size() - 1, ub, lb, c);
            CHECK(c[2] == wu.size() && ub.size() == wu.size() - 1 && std::equal(ub.begin(), ub.end(), wu.begin()), "relabel over its unique capacity na=%llu nb=%llu", na, nb);
        }
    }
    // Repeated targets: the distinct count says so (bounded or not).
    {
        std::vector<u32> a{4, 9, 4}, b{1, 9}, u, l;
        u64 c[4];
        relabel(a, b, nullptr, u, l, c);
        CHECK(c[1] == 2, "relabel counts of repeated targets: %llu distinct", c[1]);
        std::vector<u32> a2{4, 9, 4, 4}; u64 la = 3;
        relabel(a2, b, &la, nullptr, 6, u, l, c);
        CHECK(c[1] == 2 && c[3] == 3, "bounded repeated targets: %llu distinct of %llu", c[1], c[3]);
    }
    std::printf("relabel ok\n");
}

struct Csr { u64 ns; std::vector<u64> indptr; std::vector<u32> idx; u64 nd() const { return indptr.size() - 1; } };

// Floyd's k positions of a row of `deg` (draw c = hash_draw(key, c)), sorted: what
// sample_pick must place, in row order, whichever of its two paths runs.
static std::vector<u32> floyd_positions(u64 key, u64 deg, u64 k) {
    std::vector<u32> pos;
    u64 c = 0;
    for (u64 j = deg - k; j < deg; ++j, ++c) {
        u32 t = (u32)uniform_below(hash_draw(key, c), j + 1);
        pos.push_back(std::find(pos.begin(), pos.end(), t) != pos.end() ? (u32)j : t);
    }
    std::sort(pos.begin(), pos.end());
    return pos;
}
static Csr random_block(u64 nd, u64 ns, u64 maxdeg) {
    Csr c{ns, {0}, {}};
    for (u64 i = 0; i < nd; ++i) { u64 d = below(4) == 0 ? 0 : below(maxdeg + 1); for (u64 k = 0; k < d; ++k) c.idx.push_back(below(ns)); c.indptr.push_back(c.idx.size()); }
    return c;
}
static std::vector<float> src_weights(const Csr& c) {
    std::vector<u32> od(c.ns, 0);
    launch(block_out_degree, tgrid(c.idx.size()), T, (const u32*)c.idx.data(), (u64)c.idx.size(), od.data());
    std::vector<u32> want(c.ns, 0); for (u32 j : c.idx) want[j]++;
    CHECK(od == want, "out degrees");
    std::vector<float> w(c.ns);
    launch(block_src_weight, tgrid(c.ns), T, (const u32*)od.data(), c.ns, w.data());
    return w;
}

static void test_aggregate() {
    for (auto [nd, ns, deg] : std::vector<std::tuple<u64, u64, u64>>{{1, 1, 1}, {37, 91, 7}, {64, 64, 12}, {203, 517, 9}}) {
        Csr c = random_block(nd, ns, deg);
        auto sw = src_weights(c);
        std::vector<u32> od(ns, 0); for (u32 j : c.idx) od[j]++;
        for (u64 dim : {1ull, 3ull, 16ull, 17ull, 33ull, 129ull}) {
            std::vector<float> x(ns * dim), g(nd * dim);
            for (auto& v : x) v = rnd();
            for (auto& v : g) v = rnd();
            for (u32 kind = 0; kind < 3; ++kind) {
                std::vector<double> want(nd * dim, 0), wantb(ns * dim, 0);
                for (u64 i = 0; i < nd; ++i) {
                    u64 din = c.indptr[i + 1] - c.indptr[i];
                    double post = kind == 0 ? 1 : kind == 1 ? 1.0 / std::max<u64>(din, 1) : 1.0 / std::sqrt((double)std::max<u64>(din, 1));
                    for (u64 e = c.indptr[i]; e < c.indptr[i + 1]; ++e) {
                        u32 j = c.idx[e];
                        double w = kind == 2 ? 1.0 / std::sqrt((double)std::max<u32>(od[j], 1)) : 1.0;
                        for (u64 k = 0; k < dim; ++k) { want[i * dim + k] += post * w * x[j * dim + k]; wantb[j * dim + k] += post * w * g[i * dim + k]; }
                    }
                }
                std::vector<float> out(nd * dim, NAN), gx(ns * dim, 0.0f);
                launch(aggregate_forward, wgrid(nd), T, (const u64*)c.indptr.data(), (const u32*)c.idx.data(), (const float*)sw.data(), nd, dim, kind, (const float*)x.data(), out.data());
                launch(aggregate_backward, wgrid(nd), T, (const u64*)c.indptr.data(), (const u32*)c.idx.data(), (const float*)sw.data(), nd, dim, kind, (const float*)g.data(), gx.data());
                bool ok = true; for (u64 k = 0; k < nd * dim; ++k) ok &= close(out[k], want[k], 1e-5);
                CHECK(ok, "aggregate fwd kind %u %llux%llu dim %llu", kind, nd, ns, dim);
                ok = true; for (u64 k = 0; k < ns * dim; ++k) ok &= close(gx[k], wantb[k], 1e-5);
                CHECK(ok, "aggregate bwd kind %u %llux%llu dim %llu", kind, nd, ns, dim);
            }
        }
        // self loops
        std::vector<u64> ni(nd + 1); std::vector<u32> nidx(c.idx.size() + nd);
        launch(block_add_self_loops, wgrid(nd + 1), T, (const u64*)c.indptr.data(), (const u32*)c.idx.data(), nd, ni.data(), nidx.data());
        std::vector<u64> wi{0}; std::vector<u32> wx;
        for (u64 i = 0; i < nd; ++i) { for (u64 e = c.indptr[i]; e < c.indptr[i + 1]; ++e) wx.push_back(c.idx[e]); wx.push_back(i); wi.push_back(wx.size()); }
        CHECK(ni == wi && nidx == wx, "self loops");
    }
    std::printf("aggregate ok\n");
}

static void test_gat() {
    for (auto [nd, ns, deg] : std::vector<std::tuple<u64, u64, u64>>{{1, 1, 1}, {37, 91, 7}, {203, 517, 9}}) {
        for (auto [H, F] : std::vector<std::pair<u64, u64>>{{1, 1}, {3, 5}, {2, 17}, {1, 64}}) {
            Csr c = random_block(nd, ns, deg);
            u64 W = H * F, E = c.idx.size();
            std::vector<float> z(ns * W), as(W), ad(W), G(nd * W);
            for (auto& v : z) v = rnd();
            for (auto& v : as) v = 2 * rnd();
            for (auto& v : ad) v = 2 * rnd();
            for (auto& v : G) v = rnd();
            // reference (double)
            std::vector<double> el(ns * H), er(nd * H), al(E * H), out(nd * W, 0);
            for (u64 r = 0; r < ns; ++r) for (u64 h = 0; h < H; ++h) { double s = 0; for (u64 f = 0; f < F; ++f) s += as[h * F + f] * z[r * W + h * F + f]; el[r * H + h] = s; }
            for (u64 r = 0; r < nd; ++r) for (u64 h = 0; h < H; ++h) { double s = 0; for (u64 f = 0; f < F; ++f) s += ad[h * F + f] * z[r * W + h * F + f]; er[r * H + h] = s; }
            auto lk = [](double u) { return u > 0 ? u : 0.2 * u; };
            auto sl = [](double u) { return u > 0 ? 1.0 : 0.2; };
            for (u64 i = 0; i < nd; ++i) for (u64 h = 0; h < H; ++h) {
                u64 e0 = c.indptr[i], e1 = c.indptr[i + 1]; if (e0 == e1) continue;
                double m = -1e300; for (u64 e = e0; e < e1; ++e) m = std::max(m, lk(el[c.idx[e] * H + h] + er[i * H + h]));
                double s = 0; for (u64 e = e0; e < e1; ++e) { al[e * H + h] = std::exp(lk(el[c.idx[e] * H + h] + er[i * H + h]) - m); s += al[e * H + h]; }
                for (u64 e = e0; e < e1; ++e) al[e * H + h] /= s;
                for (u64 e = e0; e < e1; ++e) for (u64 f = 0; f < F; ++f) out[i * W + h * F + f] += al[e * H + h] * z[c.idx[e] * W + h * F + f];
            }
            std::vector<double> du(E * H), der(nd * H, 0), gz(ns * W, 0), del(ns * H, 0), gas(W, 0), gad(W, 0);
            for (u64 i = 0; i < nd; ++i) for (u64 h = 0; h < H; ++h) {
                u64 e0 = c.indptr[i], e1 = c.indptr[i + 1];
                double gbar = 0;
                for (u64 e = e0; e < e1; ++e) { double g = 0; for (u64 f = 0; f < F; ++f) g += G[i * W + h * F + f] * z[c.idx[e] * W + h * F + f]; du[e * H + h] = g; gbar += al[e * H + h] * g; }
                for (u64 e = e0; e < e1; ++e) { double u = el[c.idx[e] * H + h] + er[i * H + h]; double v = al[e * H + h] * (du[e * H + h] - gbar) * sl(u); du[e * H + h] = v; der[i * H + h] += v; }
            }
            for (u64 i = 0; i < nd; ++i) for (u64 e = c.indptr[i]; e < c.indptr[i + 1]; ++e) { u32 j = c.idx[e]; for (u64 k = 0; k < W; ++k) gz[j * W + k] += al[e * H + k / F] * G[i * W + k]; for (u64 h = 0; h < H; ++h) del[j * H + h] += du[e * H + h]; }
            for (u64 j = 0; j < ns; ++j) for (u64 k = 0; k < W; ++k) { gz[j * W + k] += del[j * H + k / F] * as[k] + (j < nd ? der[j * H + k / F] * ad[k] : 0); gas[k] += del[j * H + k / F] * z[j * W + k]; if (j < nd) gad[k] += der[j * H + k / F] * z[j * W + k]; }
            // emulated
            std::vector<float> fel(ns * H), fer(nd * H), fal(E * H), fout(nd * W, NAN);
            launch(gat_scores, wgrid(ns * H), T, (const float*)z.data(), ns, H, F, (const float*)as.data(), fel.data());
            launch(gat_scores, wgrid(nd * H), T, (const float*)z.data(), nd, H, F, (const float*)ad.data(), fer.data());
            launch(gat_softmax, wgrid(nd * H), T, (const u64*)c.indptr.data(), (const u32*)c.idx.data(), nd, H, (const float*)fel.data(), (const float*)fer.data(), fal.data());
            launch(gat_aggregate, wgrid(nd), T, (const u64*)c.indptr.data(), (const u32*)c.idx.data(), nd, H, F, (const float*)fal.data(), (const float*)z.data(), fout.data());
            std::vector<float> fdu(E * H), fder(nd * H), fgz(ns * W, 0), fdel(ns * H, 0);
            launch(gat_backward_dst, wgrid(nd * H), T, (const u64*)c.indptr.data(), (const u32*)c.idx.data(), nd, H, F, (const float*)z.data(), (const float*)G.data(), (const float*)fal.data(), (const float*)fel.data(), (const float*)fer.data(), fdu.data(), fder.data());
            launch(gat_backward_src, wgrid(nd), T, (const u64*)c.indptr.data(), (const u32*)c.idx.data(), nd, H, F, (const float*)fal.data(), (const float*)G.data(), (const float*)fdu.data(), fgz.data(), fdel.data());
            launch(gat_backward_finish, tgrid(ns * W), T, fgz.data(), (const float*)fdel.data(), (const float*)fder.data(), (const float*)as.data(), (const float*)ad.data(), ns, nd, H, F);
            auto cmp = [&](const char* what, const std::vector<float>& got, const std::vector<double>& want) {
                double scale = 1; for (double w : want) scale = std::max(scale, std::fabs(w));
                bool ok = got.size() == want.size();
                for (size_t k = 0; ok && k < got.size(); ++k) ok &= std::fabs(got[k] - want[k]) <= 1e-4 * scale;
                CHECK(ok, "GAT %s %llux%llu H=%llu F=%llu", what, nd, ns, H, F);
            };
            cmp("el", fel, el); cmp("er", fer, er); cmp("alpha", fal, al); cmp("out", fout, out); cmp("dz", fgz, gz);
            // a_src / a_dst via colsum
            auto colsum = [&](const float* x, u64 rows, const float* w, std::vector<float>& o) {
                u64 chunks = (rows + 255) / 256; std::vector<float> part(chunks * W);
                launch(colsum_partial, tgrid(chunks * W), T, x, rows, W, (u64)256, w, 1u, H, F, part.data());
                launch(colsum_finish, tgrid(W), T, (const float*)part.data(), chunks, W, o.data(), 0u);
            };
            std::vector<float> fgas(W), fgad(W);
            colsum(z.data(), ns, fdel.data(), fgas); colsum(z.data(), nd, fder.data(), fgad);
            cmp("da_src", fgas, gas); cmp("da_dst", fgad, gad);
        }
    }
    std::printf("gat ok\n");
}

static void test_xent() {
    for (auto [rows, classes] : std::vector<std::pair<u64, u64>>{{1, 1}, {37, 7}, {300, 41}, {1025, 3}}) {
        std::vector<float> z(rows * classes), g(rows * classes, NAN), rl(rows); std::vector<u32> lab(rows), rc(rows), fault(8, 0);
        for (auto& v : z) v = 4 * rnd();
        for (auto& l : lab) l = below(classes);
        double wl = 0; u64 wc = 0; std::vector<double> wg(rows * classes);
        for (u64 r = 0; r < rows; ++r) {
            u64 best = 0; for (u64 j = 1; j < classes; ++j) if (z[r * classes + j] > z[r * classes + best]) best = j;
            double m = z[r * classes + best], s = 0; for (u64 j = 0; j < classes; ++j) s += std::exp(z[r * classes + j] - m);
            wl += (m - z[r * classes + lab[r]]) + std::log(s); wc += best == lab[r];
            for (u64 j = 0; j < classes; ++j) wg[r * classes + j] = (std::exp(z[r * classes + j] - m - std::log(s)) - (j == lab[r])) / rows;
        }
        launch(xent_rows, wgrid(rows), T, (const float*)z.data(), rows, classes, (const u32*)lab.data(), g.data(), 1u, (float)(1.0 / rows), rl.data(), rc.data(), fault.data());
        double loss = 0; u64 corr = 0;
        u32 guard = 0;
        launch(xent_reduce, 1, 256, (const float*)rl.data(), (const u32*)rc.data(), rows, &loss, &corr, &guard);
        CHECK(close(loss / rows, wl / rows, 1e-5) && corr == wc && fault[0] == 0, "xent %llux%llu loss %g vs %g correct %llu vs %llu", rows, classes, loss / rows, wl / rows, corr, wc);
        CHECK(guard == 0, "xent guard set by a finite loss");
        // The guard is sticky: a NaN or an infinite row loss sets it, a finite sum
        // afterwards does not clear it; a null guard is never written.
        for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
            std::vector<float> rb = rl; rb[below(rows)] = bad; u32 g2 = 0; double l2 = 0; u64 c2 = 0;
            launch(xent_reduce, 1, 256, (const float*)rb.data(), (const u32*)rc.data(), rows, &l2, &c2, &g2);
            CHECK(g2 == 1 && !std::isfinite(l2), "xent guard not set by a loss of %g", bad);
            launch(xent_reduce, 1, 256, (const float*)rl.data(), (const u32*)rc.data(), rows, &l2, &c2, &g2);
            CHECK(g2 == 1 && std::isfinite(l2), "xent guard cleared by a finite loss");
            launch(xent_reduce, 1, 256, (const float*)rb.data(), (const u32*)rc.data(), rows, &l2, &c2, (u32*)nullptr);
        }
        bool ok = true; for (u64 k = 0; k < rows * classes; ++k) ok &= std::fabs(g[k] - wg[k]) <= 1e-5; CHECK(ok, "xent grad");
        lab[rows - 1] = classes;
        launch(xent_rows, wgrid(rows), T, (const float*)z.data(), rows, classes, (const u32*)lab.data(), g.data(), 0u, (float)(1.0 / rows), rl.data(), rc.data(), fault.data());
        CHECK(fault[0] == 4 && fault[1] == classes && fault[3] == classes, "xent fault");
    }
    std::printf("xent ok\n");
}

// Mirrors sample_layer's step 2: the counts scanned into indptr (nf + 1 entries)
// by sample_count_scan, plus the rest of a multi-tile scan.
static void count_scan(const std::vector<u64>& ip, u64 nv, const std::vector<u32>& front, u64 nf, const u64* live, u32 fanout, const u8* skip, std::vector<u64>& indptr, std::vector<u32>& fault) {
    indptr.assign(nf + 1, 0xeeeeull);
    unsigned t = scan_tiles(nf + 1);
    std::vector<u64> sums(t > 1 ? t : 0, 0xdeadull);
    launch(sample_count_scan, t, SCAN_THREADS, (const u64*)ip.data(), nv, (const u32*)front.data(), nf, live, fanout, skip, indptr.data(), t > 1 ? sums.data() : (u64*)nullptr, fault.data());
    finish_scan<u64>(indptr, nf + 1, sums);
}

static void test_sample() {
    // random graph, sorted rows, with a hub
    u64 n = 3000; std::vector<std::set<u32>> adj(n);
    for (int k = 0; k < 20000; ++k) { u32 a = below(n) * below(n) / n, b = below(n); if (a != b) { adj[a].insert(b); adj[b].insert(a); } }
    for (u32 v = 1; v < 2500; ++v) { adj[0].insert(v); adj[v].insert(0); }
    std::vector<u64> ip{0}; std::vector<u32> ix;
    for (auto& s : adj) { for (u32 v : s) ix.push_back(v); ip.push_back(ix.size()); }
    for (u32 fanout : {1u, 5u, 25u, 32u, 33u, 40u, 2000u, 0xffffffffu}) {
        std::vector<u32> front; for (u32 v = 0; v < 400; ++v) front.push_back(v * 7 % n); front[0] = 0;
        u64 nf = front.size();
        std::vector<u64> cnt; std::vector<u32> fault(8, 0);
        count_scan(ip, n, front, nf, nullptr, fanout, nullptr, cnt, fault);
        u64 E = cnt[nf];
        std::vector<u32> pos(E), nb(E);
        launch(sample_pick, wgrid(nf), T, (const u64*)ip.data(), (const u32*)ix.data(), n, (const u32*)front.data(), nf, (const u64*)nullptr, (u64)12345, (const u64*)cnt.data(), pos.data(), nb.data());
        bool ok = fault[0] == 0;
        for (u64 i = 0; i < nf; ++i) {
            u32 v = front[i]; u64 deg = ip[v + 1] - ip[v]; u64 k = cnt[i + 1] - cnt[i];
            ok &= k == std::min<u64>(deg, fanout);
            std::vector<u32> picked(nb.begin() + cnt[i], nb.begin() + cnt[i + 1]);
            for (size_t q = 1; q < picked.size(); ++q) ok &= picked[q - 1] < picked[q];  // row order, distinct
            for (u32 u : picked) ok &= adj[v].count(u) == 1;
            // Exactly Floyd's draws (the register path for k <= 32 and the scratch
            // path above pick the same positions).
            if (k < deg) {
                std::vector<u32> want;
                for (u32 q : floyd_positions(hash_key(12345, v), deg, k)) want.push_back(ix[ip[v] + q]);
                ok &= picked == want;
            }
            if (!ok) { std::printf("  dst %u deg %llu k %llu\n", v, deg, k); break; }
        }
        CHECK(ok, "sample fanout %u", fanout);
        // Fanouts up to 32 never touch the scratch (the host passes none).
        if (fanout <= 32) {
            std::vector<u32> nb0(E, 0xeeeeeeeeu);
            launch(sample_pick, wgrid(nf), T, (const u64*)ip.data(), (const u32*)ix.data(), n, (const u32*)front.data(), nf, (const u64*)nullptr, (u64)12345, (const u64*)cnt.data(), (u32*)nullptr, nb0.data());
            CHECK(nb0 == nb, "sample_pick without scratch, fanout %u", fanout);
        }
        // As sample_layer does it: buffers sized by the bound nf · min(fanout, max
        // degree) (poisoned), the edge count left on the device for the relabel.
        {
            u64 maxdeg = 0; for (u64 v = 0; v < n; ++v) maxdeg = std::max<u64>(maxdeg, ip[v + 1] - ip[v]);
            u64 bound = nf * std::min<u64>(fanout, maxdeg);
            std::vector<u32> pb(bound, 0xeeeeeeeeu), nbb(bound, 0xeeeeeeeeu);
            launch(sample_pick, wgrid(nf), T, (const u64*)ip.data(), (const u32*)ix.data(), n, (const u32*)front.data(), nf, (const u64*)nullptr, (u64)12345, (const u64*)cnt.data(), pb.data(), nbb.data());
            CHECK(bound >= E && std::equal(nb.begin(), nb.end(), nbb.begin()), "bounded sample_pick fanout %u", fanout);
            std::vector<u32> u1, l1, u2, l2; u64 c1[4], c2[4];
            relabel(front, nb, nullptr, u1, l1, c1);
            relabel(front, nbb, &cnt[nf], u2, l2, c2);
            CHECK(u1 == u2 && std::equal(l1.begin(), l1.end(), l2.begin()) && c2[0] == E && c2[1] == nf && c2[2] == u1.size(),
                  "bounded relabel of a sampled layer, fanout %u", fanout);
        }
        // The same hop with a skip mask (sample_hop): flagged destinations (any
        // non-zero byte, the hub included) count 0 and pick nothing; the others keep
        // exactly their unmasked neighbors (the draws are keyed by vertex, not slot).
        std::vector<u8> skip(nf);
        for (u64 i = 0; i < nf; ++i) skip[i] = below(3) == 0 ? (u8)(1 + below(255)) : 0;
        skip[0] = 1; skip[nf - 1] = 0;
        std::vector<u64> cs;
        count_scan(ip, n, front, nf, nullptr, fanout, skip.data(), cs, fault);
        bool counts_ok = fault[0] == 0 && cs[0] == 0;
        for (u64 i = 0; i < nf; ++i) {
            u32 v = front[i]; u64 deg = ip[v + 1] - ip[v];
            counts_ok &= cs[i + 1] - cs[i] == (skip[i] ? 0 : std::min<u64>(deg, fanout));
        }
        CHECK(counts_ok, "sample_count_scan skip fanout %u", fanout);
        std::vector<u32> ps(cs[nf]), ns(cs[nf]);
        launch(sample_pick, wgrid(nf), T, (const u64*)ip.data(), (const u32*)ix.data(), n, (const u32*)front.data(), nf, (const u64*)nullptr, (u64)12345, (const u64*)cs.data(), ps.data(), ns.data());
        bool skip_ok = true;
        for (u64 i = 0; i < nf; ++i) {
            std::vector<u32> got(ns.begin() + cs[i], ns.begin() + cs[i + 1]);
            std::vector<u32> want;
            if (!skip[i]) want.assign(nb.begin() + cnt[i], nb.begin() + cnt[i + 1]);
            skip_ok &= got == want;
        }
        CHECK(skip_ok, "sample_pick with skip mask fanout %u", fanout);
        // A skipped vertex outside the graph is still reported.
        std::vector<u32> bad{1, (u32)n};
        std::vector<u8> both{1, 1};
        std::vector<u64> cb;
        count_scan(ip, n, bad, 2, nullptr, fanout, both.data(), cb, fault);
        CHECK(fault[0] == FAULT_SAMPLE_VERTEX && fault[1] == (u32)n && cb[0] == 0 && cb[1] == 0 && cb[2] == 0, "sample_count_scan fault under skip");
        std::fill(fault.begin(), fault.end(), 0u);
    }
    // uniformity: vertex 0 (degree 2499), fanout 5, many seeds: each neighbor ~ 5/2499
    std::vector<u64> hits(n, 0);
    u32 v0 = 0; u64 trials = 4000;
    std::vector<u64> cnt{0, 5}; std::vector<u32> pos(5), nb(5);
    for (u64 s = 0; s < trials; ++s) {
        launch(sample_pick, 1, 32, (const u64*)ip.data(), (const u32*)ix.data(), n, (const u32*)&v0, (u64)1, (const u64*)nullptr, s * 0x9E3779B97F4A7C15ull, (const u64*)cnt.data(), pos.data(), nb.data());
        for (u32 u : nb) hits[u]++;
    }
    // bucket counts by position tenths: expect 2000 each
    u64 deg = ip[1] - ip[0]; std::vector<u64> buckets(10, 0);
    for (u64 p = 0; p < deg; ++p) buckets[p * 10 / deg] += hits[ix[ip[0] + p]];
    bool ok = true; for (u64 b : buckets) ok &= b > 1800 && b < 2200;
    CHECK(ok, "sample uniformity buckets %llu %llu %llu ...", buckets[0], buckets[1], buckets[9]);
    std::printf("sample ok\n");
}

// sample_count_scan at the scan's boundary sizes (nf + 1 = 1, 2, SCAN_TILE,
// SCAN_TILE + 1, ...) against a scalar prefix of min(fanout, degree), unbounded
// and with a device live count over a longer buffer whose tail would fault if read.
static void test_count_scan() {
    const u64 nv = 5000;
    std::vector<u64> ip{0};
    for (u64 v = 0; v < nv; ++v) ip.push_back(ip.back() + (below(5) == 0 ? 0 : below(41)));
    for (u64 nf : {0ull, 1ull, (u64)SCAN_TILE - 1, (u64)SCAN_TILE, (u64)SCAN_TILE + 1, 3ull * SCAN_TILE + 5}) {
        for (u32 fanout : {1u, 10u, 0xffffffffu}) {
            std::vector<u32> front(nf); for (auto& v : front) v = below(nv);
            std::vector<u64> want{0};
            for (u32 v : front) want.push_back(want.back() + std::min<u64>(ip[v + 1] - ip[v], fanout));
            std::vector<u64> got; std::vector<u32> fault(8, 0);
            unsigned long long before = g_launches;
            count_scan(ip, nv, front, nf, nullptr, fanout, nullptr, got, fault);
            CHECK(got == want && fault[0] == 0, "sample_count_scan nf=%llu fanout %u", nf, fanout);
            CHECK(g_launches - before == scan_launch_count(nf + 1), "sample_count_scan nf=%llu: %llu launches", nf, g_launches - before);
            for (u64 extra : {1ull, 999ull}) {
                std::vector<u32> fb = front;
                for (u64 q = 0; q < extra; ++q) fb.push_back(q % 2 ? (u32)(nv + q) : (u32)below(nv));
                u64 live = nf;
                count_scan(ip, nv, fb, nf + extra, &live, fanout, nullptr, got, fault);
                bool ok = fault[0] == 0 && std::equal(want.begin(), want.end(), got.begin());
                for (u64 i = nf; i <= nf + extra; ++i) ok &= got[i] == want[nf];
                CHECK(ok, "bounded sample_count_scan nf=%llu extra=%llu fanout %u", nf, extra, fanout);
            }
        }
    }
    std::printf("count scan ok\n");
}

// The whole chain as CudaBackend::sample runs it (sampling.rs): every layer sized by
// bounds (frontier capacity × min(fanout, max degree) edges, capacity + edges
// sources capped at the vertex count), the frontier of a layer being the sources
// of the layer above with their count on the device, poison past every live
// prefix, and the four counts per layer read once at the end — against a scalar
// reference of layered sampling (Floyd's positions in row order, first-occurrence
// relabel). Also checks the launches per layer against the scan plan.
static void test_sample_chain() {
    u64 nv = 3000; std::vector<std::set<u32>> adj(nv);
    for (int k = 0; k < 12000; ++k) { u32 a = below(nv) * below(nv) / nv, b = below(nv); if (a != b) { adj[a].insert(b); adj[b].insert(a); } }
    for (u32 v = 1; v < 700; ++v) { adj[0].insert(v); adj[v].insert(0); }
    std::vector<u64> ip{0}; std::vector<u32> ix;
    for (auto& st : adj) { for (u32 v : st) ix.push_back(v); ip.push_back(ix.size()); }
    u64 maxdeg = 0; for (u64 v = 0; v < nv; ++v) maxdeg = std::max<u64>(maxdeg, ip[v + 1] - ip[v]);
    const u64 seed = 99;
    for (auto fanouts : std::vector<std::vector<u32>>{{3, 4, 5}, {40, 2, 6}, {0xffffffffu, 3}, {1}}) {
        std::vector<u32> seeds(nv); std::iota(seeds.begin(), seeds.end(), 0); std::shuffle(seeds.begin(), seeds.end(), rng);
        seeds.resize(fanouts.size() == 1 ? 1 : 150);
        const size_t L = fanouts.size();
        // Scalar reference, top layer first.
        std::vector<std::vector<u64>> r_ip(L); std::vector<std::vector<u32>> r_loc(L), r_src(L);
        std::vector<u32> front = seeds;
        for (size_t li = 0; li < L; ++li) {
            size_t layer = L - 1 - li; u64 key = seed * 1000003 + layer;
            std::map<u32, u32> pos; std::vector<u32> uniq;
            for (u32 v : front) { pos[v] = uniq.size(); uniq.push_back(v); }
            r_ip[li] = {0};
            for (u32 v : front) {
                u64 deg = ip[v + 1] - ip[v], k = std::min<u64>(deg, fanouts[layer]);
                std::vector<u32> picked;
                if (k >= deg) for (u64 q = 0; q < deg; ++q) picked.push_back(ix[ip[v] + q]);
                else for (u32 q : floyd_positions(hash_key(key, v), deg, k)) picked.push_back(ix[ip[v] + q]);
                for (u32 u : picked) { auto it = pos.find(u); if (it == pos.end()) { pos[u] = uniq.size(); r_loc[li].push_back(uniq.size()); uniq.push_back(u); } else r_loc[li].push_back(it->second); }
                r_ip[li].push_back(r_loc[li].size());
            }
            r_src[li] = uniq; front = uniq;
        }
        // The device chain.
        std::vector<u64> counts(4 * L, 0x7777);
        std::vector<u32> cur = seeds; u64 cap = seeds.size(); const u64* live = nullptr;
        std::vector<u32> fault(8, 0);
        std::vector<std::vector<u64>> d_ip(L); std::vector<std::vector<u32>> d_loc(L), d_src(L);
        std::vector<unsigned long long> launches(L);
        for (size_t li = 0; li < L; ++li) {
            size_t layer = L - 1 - li; u64 key = seed * 1000003 + layer; u32 f = fanouts[layer];
            unsigned long long before = g_launches;
            std::vector<u64> indptr;
            count_scan(ip, nv, cur, cap, live, f, nullptr, indptr, fault);
            u64 cap_e = cap * std::min<u64>(f, maxdeg);
            std::vector<u32> nbrs(cap_e, 0xfffffff0u), scratch(f > 32 ? cap_e : 0);
            launch(sample_pick, wgrid(cap), T, (const u64*)ip.data(), (const u32*)ix.data(), nv, (const u32*)cur.data(), cap, live, key, (const u64*)indptr.data(), f > 32 ? scratch.data() : (u32*)nullptr, nbrs.data());
            u64 cap_src = std::min<u64>(cap + cap_e, nv);
            std::vector<u32> uniq, loc;
            relabel(cur, nbrs, live, &indptr[cap], cap_src, uniq, loc, &counts[4 * li]);
            launches[li] = g_launches - before;
            CHECK(launches[li] == scan_launch_count(cap + 1) + 3 + scan_launch_count(cap + cap_e + 1),
                  "chain %zu layers, layer %zu: %llu launches", L, layer, launches[li]);
            d_ip[li] = indptr; d_loc[li] = loc;
            uniq.resize(cap_src, 0xfffffff0u);  // poison past the live sources
            d_src[li] = uniq;
            cur = uniq; cap = cap_src; live = &counts[4 * li + 2];
        }
        bool ok = fault[0] == 0;
        for (size_t li = 0; li < L && ok; ++li) {
            u64 nd = counts[4 * li + 3], ne = counts[4 * li], ns = counts[4 * li + 2];
            ok &= nd == r_ip[li].size() - 1 && counts[4 * li + 1] == nd && ne == r_loc[li].size() && ns == r_src[li].size();
            ok &= ok && std::equal(r_ip[li].begin(), r_ip[li].end(), d_ip[li].begin());
            ok &= ok && std::equal(r_loc[li].begin(), r_loc[li].end(), d_loc[li].begin());
            ok &= ok && std::equal(r_src[li].begin(), r_src[li].end(), d_src[li].begin());
            if (!ok) std::printf("  layer %zu: dst %llu/%zu edges %llu/%zu src %llu/%zu\n", L - 1 - li, nd, r_ip[li].size() - 1, ne, r_loc[li].size(), ns, r_src[li].size());
        }
        CHECK(ok, "bounded sampling chain, %zu layers (fanout of layer 0: %u)", L, fanouts[0]);
        std::printf("  chain %zu layers:", L);
        for (size_t li = 0; li < L; ++li) std::printf(" layer %zu %llu launches (%llu dst, %llu edges, %llu src);", L - 1 - li, launches[li], counts[4 * li + 3], counts[4 * li], counts[4 * li + 2]);
        std::printf("\n");
    }
    std::printf("sample chain ok\n");
}

// bfloat16 bits of x: round to nearest, ties to even (finite x).
static u16 to_bf16(float x) {
    u32 b = std::bit_cast<u32>(x);
    return (u16)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

static void test_gather_bf16() {
    u64 rows = 300;
    // 8 and 128: the 16-byte path; 1, 7, 100, 129: one value per lane.
    for (u64 dim : {1ull, 7ull, 8ull, 100ull, 128ull, 129ull}) {
        std::vector<u16> host(rows * dim); for (auto& v : host) v = to_bf16(rnd() * 100.0f);
        std::vector<u32> slot(rows, 0xffffffffu);
        std::vector<u32> ins; for (u32 v = 0; v < 90; ++v) ins.push_back(v * 3 + 1);
        std::vector<u32> slots(ins.size()); std::iota(slots.begin(), slots.end(), 0);
        std::vector<u16> cache(ins.size() * dim, 0);
        launch(cache_insert_bf16, wgrid(ins.size()), T, (const u16*)host.data(), (const u32*)ins.data(), (const u32*)slots.data(), (u64)ins.size(), dim, cache.data(), slot.data());
        bool ok = true;
        for (u64 i = 0; i < ins.size(); ++i) for (u64 k = 0; k < dim; ++k) ok &= cache[i * dim + k] == host[ins[i] * dim + k] && slot[ins[i]] == slots[i];
        CHECK(ok, "cache_insert_bf16 dim %llu", dim);
        // 33 groups of 32 rows, the last partial: the warps' group loop runs 3 times.
        u64 n = 1029; std::vector<u32> ids(n); for (auto& i : ids) i = below(rows);
        std::vector<float> out(n * dim, NAN); std::vector<u64> ctr(2, 0); std::vector<u32> fault(8, 0);
        launch(gather_rows_bf16, wgrid((n + 31) / 32), T, (const u32*)slot.data(), (const u16*)cache.data(), (const u16*)host.data(), (const u32*)ids.data(), n, rows, dim, out.data(), ctr.data(), fault.data());
        u64 hits = 0; ok = true;
        for (u64 r = 0; r < n; ++r) {
            hits += slot[ids[r]] != 0xffffffffu;
            for (u64 k = 0; k < dim; ++k) ok &= out[r * dim + k] == std::bit_cast<float>((u32)host[ids[r] * dim + k] << 16);
        }
        CHECK(ok && ctr[0] == hits && ctr[1] == n - hits && fault[0] == 0, "gather_rows_bf16 dim %llu", dim);
        ids[9] = rows + 4;
        launch(gather_rows_bf16, wgrid((n + 31) / 32), T, (const u32*)slot.data(), (const u16*)cache.data(), (const u16*)host.data(), (const u32*)ids.data(), n, rows, dim, out.data(), ctr.data(), fault.data());
        CHECK(fault[0] == 1 && fault[1] == rows + 4 && out[9 * dim] == 0.0f, "gather_rows_bf16 fault");
    }
    // widen_bf16: aligned (pairs, odd tails) and unaligned sources.
    for (u64 n : {1ull, 2ull, 7ull, 1000ull, 1001ull}) {
        for (u64 off : {0ull, 1ull}) {
            std::vector<u16> src(n + 1); for (auto& v : src) v = to_bf16(rnd() * 7.0f);
            std::vector<float> out(n + 1, NAN);
            launch(widen_bf16, tgrid(n), T, (const u16*)(src.data() + off), n, out.data());
            bool ok = std::isnan(out[n]);
            for (u64 i = 0; i < n; ++i) ok &= out[i] == std::bit_cast<float>((u32)src[i + off] << 16);
            CHECK(ok, "widen_bf16 n %llu offset %llu", n, off);
        }
    }
    // scale_in_place: one rounded product per value, nothing past n.
    for (u64 n : {1ull, 1000ull}) {
        std::vector<float> x(n + 1); for (auto& v : x) v = rnd() * 100.0f;
        std::vector<float> want(x);
        for (u64 i = 0; i < n; ++i) want[i] = x[i] * 0.37f;
        launch(scale_in_place, tgrid(n), T, x.data(), n, 0.37f);
        CHECK(std::memcmp(x.data(), want.data(), (n + 1) * sizeof(float)) == 0, "scale_in_place n %llu", n);
    }
    // count_nonfinite: NaN and ±inf counted, finite extremes not, added to the counter.
    for (u64 n : {1ull, 33ull, 5000ull}) {
        std::vector<float> x(n + 1); for (auto& v : x) v = rnd();
        x[n] = NAN;  // past n: not counted
        x[0] = 3.4e38f;
        u32 want = 5;
        for (u64 k = 0; k < n / 10; ++k) {
            const u64 at = below(n);
            const float s[3] = {NAN, INFINITY, -INFINITY};
            x[at] = s[k % 3];
        }
        for (u64 i = 0; i < n; ++i) want += !std::isfinite(x[i]);
        std::vector<u32> count{5};
        launch(count_nonfinite, tgrid(n), T, (const float*)x.data(), n, count.data());
        CHECK(count[0] == want, "count_nonfinite n %llu: %u vs %u", n, count[0], want);
    }
    std::printf("gather bf16 ok\n");
}

static void test_gather_and_rows() {
    u64 rows = 500;
    for (u64 dim : {1ull, 7ull, 100ull, 129ull, 4ull}) {
        std::vector<float> host(rows * dim); for (auto& v : host) v = rnd();
        std::vector<u32> slot(rows, 0xffffffffu);
        std::vector<u32> ins; for (u32 v = 0; v < 150; ++v) ins.push_back(v * 3);
        std::vector<u32> slots(ins.size()); std::iota(slots.begin(), slots.end(), 0);
        std::vector<float> cache(ins.size() * dim);
        launch(cache_insert, wgrid(ins.size()), T, (const float*)host.data(), (const u32*)ins.data(), (const u32*)slots.data(), (u64)ins.size(), dim, cache.data(), slot.data());
        std::vector<u32> ev{0, 3};
        launch(cache_evict, tgrid(2), T, slot.data(), (const u32*)ev.data(), (u64)2);
        // 42 groups of 32 rows, the last partial: the warps' group loop runs 3 times.
        u64 n = 1333; std::vector<u32> ids(n); for (auto& i : ids) i = below(rows);
        std::vector<float> out(n * dim, NAN); std::vector<u64> ctr(2, 0); std::vector<u32> fault(8, 0);
        launch(gather_rows, wgrid((n + 31) / 32), T, (const u32*)slot.data(), (const float*)cache.data(), (const float*)host.data(), (const u32*)ids.data(), n, rows, dim, out.data(), ctr.data(), fault.data());
        u64 hits = 0; bool ok = true;
        for (u64 r = 0; r < n; ++r) { hits += slot[ids[r]] != 0xffffffffu; for (u64 k = 0; k < dim; ++k) ok &= out[r * dim + k] == host[ids[r] * dim + k]; }
        CHECK(ok && ctr[0] == hits && ctr[1] == n - hits && fault[0] == 0, "gather dim %llu", dim);
        ids[5] = rows;
        launch(gather_rows, wgrid((n + 31) / 32), T, (const u32*)slot.data(), (const float*)cache.data(), (const float*)host.data(), (const u32*)ids.data(), n, rows, dim, out.data(), ctr.data(), fault.data());
        CHECK(fault[0] == 1 && fault[1] == rows && out[5 * dim] == 0.0f, "gather fault");
        // select / put
        std::vector<u32> idx(101); for (auto& i : idx) i = below(57);
        std::vector<float> src(57 * dim); for (auto& v : src) v = rnd();
        std::vector<float> sel(101 * dim); std::fill(fault.begin(), fault.end(), 0);
        launch(index_select_rows, wgrid(101), T, (const float*)src.data(), (u64)57, dim, (const u32*)idx.data(), (u64)101, sel.data(), fault.data());
        ok = true; for (u64 r = 0; r < 101; ++r) for (u64 k = 0; k < dim; ++k) ok &= sel[r * dim + k] == src[idx[r] * dim + k];
        CHECK(ok && fault[0] == 0, "select");
        std::vector<u32> places(80); std::iota(places.begin(), places.end(), 0); std::shuffle(places.begin(), places.end(), rng);
        std::vector<float> dst(80 * dim, 9.0f), want = dst;
        launch(index_put_rows, wgrid(57), T, (const float*)src.data(), dim, (const u32*)places.data(), (u64)57, dst.data(), (u64)80, fault.data());
        for (u64 r = 0; r < 57; ++r) for (u64 k = 0; k < dim; ++k) want[places[r] * dim + k] = src[r * dim + k];
        CHECK(dst == want && fault[0] == 0, "put");
    }
    std::printf("gather/rows ok\n");
}

static void test_math() {
    u64 n = 70001;
    std::vector<float> x(n); for (auto& v : x) v = 0.5f + std::fabs(rnd());
    for (float p : {0.0f, 0.1f, 0.5f, 1.0f}) {
        std::vector<float> y = x, g(n, 1.0f); std::vector<u32> mask((n + 31) / 32);
        u32 thr = (u32)std::lround(p * 65536.0); float scale = p < 1 ? (float)(1.0 / (1.0 - p)) : 0.0f;
        launch(dropout_forward, wgrid(mask.size()), T, y.data(), n, thr, scale, (u64)77, mask.data());
        launch(dropout_backward, tgrid(n), T, (const u32*)mask.data(), g.data(), n, scale);
        u64 kept = 0; bool ok = true;
        for (u64 i = 0; i < n; ++i) {
            bool k = (mask[i / 32] >> (i % 32)) & 1; kept += k;
            ok &= k ? (y[i] == x[i] * scale && g[i] == scale) : (y[i] == 0 && g[i] == 0);
            // Element i is kept exactly when its own 16-bit draw clears the threshold.
            ok &= k == ((u32)(hash_draw((u64)77, i) >> 48) >= thr);
        }
        for (u64 b = n % 32; n % 32 != 0 && b < 32; ++b) ok &= ((mask.back() >> b) & 1) == 0;
        double frac = (double)kept / n;
        CHECK(ok && std::fabs(frac - (1 - p)) < 0.01, "dropout p=%g kept %g", p, frac);
    }
    // The fused hidden-layer kernels equal the unfused sequence bit for bit:
    // add_bias, relu/elu, copy, dropout_forward; dropout_backward, relu/elu_backward.
    for (auto [rows, cols] : std::vector<std::pair<u64, u64>>{{1, 1}, {37, 5}, {301, 33}, {64, 256}, {0, 7}}) {
        u64 nn = rows * cols;
        for (u32 act : {0u, 1u}) for (float p : {-1.0f, 0.0f, 0.3f, 1.0f}) {
            const bool drop = p >= 0;
            std::vector<float> x0(nn), bias(cols), dy0(nn);
            for (auto& v : x0) v = 3 * rnd();
            for (auto& v : bias) v = rnd();
            for (auto& v : dy0) v = rnd();
            // NaN, an exact +0 sum and a -0 sum (ReLU keeps -0, as the unfused kernel).
            if (nn > 3) { x0[1] = std::nanf(""); x0[2] = -bias[2 % cols]; x0[0] = -0.0f; bias[0] = -0.0f; }
            u32 thr = drop ? (u32)std::lround(p * 65536.0) : 0; float scale = drop && p < 1 ? (float)(1.0 / (1.0 - p)) : 0.0f;
            const float alpha = 0.7f; const u64 key = 4242;
            // unfused
            std::vector<float> ya = x0, ha; std::vector<u32> ma((nn + 31) / 32, 7);
            launch(add_bias, tgrid(nn), T, ya.data(), (const float*)bias.data(), rows, cols);
            if (act == 0) launch(relu_forward, tgrid(nn), T, ya.data(), nn); else launch(elu_forward, tgrid(nn), T, ya.data(), nn, alpha);
            ha = ya;
            if (drop) launch(dropout_forward, wgrid(ma.size()), T, ha.data(), nn, thr, scale, key, ma.data());
            // fused
            std::vector<float> yb = x0, hb(nn, 123.0f); std::vector<u32> mb((nn + 31) / 32, 7);
            launch(bias_act_dropout, wgrid(mb.size()), T, yb.data(), (const float*)bias.data(), rows, cols, act, alpha, drop ? 1u : 0u, thr, scale, key, hb.data(), mb.data());
            auto bits = [](const std::vector<float>& v) { std::vector<u32> b(v.size()); for (size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<u32>(v[i]); return b; };
            bool ok = bits(ya) == bits(yb) && (!drop || (bits(ha) == bits(hb) && ma == mb));
            if (!drop) ok &= mb == std::vector<u32>((nn + 31) / 32, 7) && hb == std::vector<float>(nn, 123.0f);
            CHECK(ok, "bias_act_dropout %llux%llu act %u p %g", rows, cols, act, p);
            if (!drop) continue;
            std::vector<float> ga = dy0, gb = dy0;
            launch(dropout_backward, tgrid(nn), T, (const u32*)ma.data(), ga.data(), nn, scale);
            if (act == 0) launch(relu_backward, tgrid(nn), T, (const float*)ya.data(), ga.data(), nn);
            else launch(elu_backward, tgrid(nn), T, (const float*)ya.data(), ga.data(), nn, alpha);
            launch(dropout_act_backward, tgrid(nn), T, (const u32*)mb.data(), (const float*)yb.data(), gb.data(), nn, scale, act, alpha);
            CHECK(bits(ga) == bits(gb), "dropout_act_backward %llux%llu act %u p %g", rows, cols, act, p);
        }
    }
    // bias grad / colsum
    for (auto [rows, cols] : std::vector<std::pair<u64, u64>>{{1, 1}, {37, 5}, {1029, 129}, {0, 3}}) {
        std::vector<float> dy(rows * cols); for (auto& v : dy) v = rnd();
        u64 chunks = (rows + 255) / 256; std::vector<float> part(chunks * cols), out(cols, 2.0f);
        launch(colsum_partial, tgrid(chunks * cols), T, (const float*)dy.data(), rows, cols, (u64)256, (const float*)nullptr, 0u, (u64)0, (u64)1, part.data());
        launch(colsum_finish, tgrid(cols), T, (const float*)part.data(), chunks, cols, out.data(), 1u);
        // A float sum's rounding error scales with the sum of magnitudes, not the
        // sum (which can be near zero); one missing term would be ~0.5 off.
        bool ok = true; for (u64 c = 0; c < cols; ++c) { double s = 2, l1 = 2; for (u64 r = 0; r < rows; ++r) { s += dy[r * cols + c]; l1 += std::fabs(dy[r * cols + c]); } ok &= std::fabs(out[c] - s) <= 1e-6 * l1; }
        CHECK(ok, "bias grad %llux%llu", rows, cols);
    }
    // act_backward_colsum: the backward (with or without the dropout mask) equals the
    // unfused kernels bit for bit, the column sums of its result match a double
    // reference (accumulated and not), the ticket is 0 again after each launch, and a
    // second launch gives the same bits. Odd shapes; chunks of 8 and 40 rows (1 and
    // 5 rows a warp: the 4-row step and its tail) and the host's choice; grids
    // smaller than the work (the item loop wraps).
    for (auto [rows, cols] : std::vector<std::pair<u64, u64>>{{1, 1}, {37, 5}, {301, 33}, {64, 256}, {1029, 129}, {4100, 40}, {0, 7}, {9, 0}}) {
        const u64 nn = rows * cols;
        const u64 host_chunk = std::max<u64>(8, ((rows + 63) / 64 + 7) / 8 * 8);
        for (u64 chunk_rows : {(u64)8, (u64)40, host_chunk}) for (u32 act : {0u, 1u}) for (u32 has_mask : {0u, 1u}) {
            std::vector<float> y(nn), dy0(nn);
            for (auto& v : y) v = rnd() > 0 ? 2 * rnd() : -0.6f * std::fabs(rnd());
            for (auto& v : dy0) v = rnd();
            if (nn > 2) { y[0] = 0.0f; y[1] = std::nanf(""); }
            std::vector<u32> mask((nn + 31) / 32);
            for (auto& m : mask) m = (u32)rng();
            const float scale = 1.0f / 0.7f, alpha = 0.7f;
            std::vector<float> ga = dy0;
            if (has_mask) launch(dropout_backward, tgrid(nn), T, (const u32*)mask.data(), ga.data(), nn, scale);
            if (act == 0) launch(relu_backward, tgrid(nn), T, (const float*)y.data(), ga.data(), nn);
            else launch(elu_backward, tgrid(nn), T, (const float*)y.data(), ga.data(), nn, alpha);
            const u64 chunks = (rows + chunk_rows - 1) / chunk_rows, tiles = (cols + 31) / 32;
            const unsigned grid = (unsigned)std::max<u64>(1, std::min<u64>(chunks * tiles, 3));
            std::vector<u32> out_bits[2];
            for (u32 accumulate : {0u, 1u}) for (int rep = 0; rep < 2; ++rep) {
                std::vector<float> gb = dy0, part(std::max<u64>(1, chunks * cols), 77.0f), out(cols, 2.0f);
                u32 ticket = 0;
                launch(act_backward_colsum, grid, T, (const u32*)mask.data(), has_mask, (const float*)y.data(), gb.data(), rows, cols, scale, act, alpha, chunk_rows, part.data(), &ticket, out.data(), accumulate);
                auto fbits = [](const std::vector<float>& v) { std::vector<u32> b(v.size()); for (size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<u32>(v[i]); return b; };
                bool ok = fbits(ga) == fbits(gb) && ticket == 0;
                for (u64 c = 0; c < cols; ++c) {
                    double s = accumulate ? 2 : 0, l1 = 2; bool nan = false;
                    for (u64 r = 0; r < rows; ++r) { double g = ga[r * cols + c]; nan |= std::isnan(g); s += g; l1 += std::fabs(g); }
                    ok &= nan ? std::isnan(out[c]) : std::fabs(out[c] - s) <= 1e-6 * l1;
                }
                if (rep == 0) out_bits[accumulate] = fbits(out); else ok &= fbits(out) == out_bits[accumulate];
                CHECK(ok, "act_backward_colsum %llux%llu chunk %llu act %u mask %u acc %u rep %d", rows, cols, chunk_rows, act, has_mask, accumulate, rep);
            }
        }
    }
    // elu, relu
    std::vector<float> e(1000), r2; for (auto& v : e) v = 3 * rnd(); e[0] = 0; r2 = e;
    std::vector<float> e2 = e;
    launch(elu_forward, tgrid(1000), T, e2.data(), (u64)1000, 0.7f);
    launch(relu_forward, tgrid(1000), T, r2.data(), (u64)1000);
    bool ok = true; for (int i = 0; i < 1000; ++i) { double w = e[i] > 0 ? e[i] : 0.7 * (std::exp((double)e[i]) - 1); ok &= std::fabs(e2[i] - w) <= 1e-6; ok &= r2[i] == (e[i] < 0 ? 0.0f : e[i]); }
    CHECK(ok, "elu/relu");
    std::printf("math ok\n");
}

// Adam: `adam_multi` over a table of tensors (odd lengths, an empty one, one of a
// single element) equals one `adam_step` per tensor bit for bit, both equal a
// double-precision reference of the formula, and a set guard updates nothing.
static void test_adam() {
    const std::vector<u64> lens{70001, 0, 1, 257, 3, 4096, 33};
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f, lr = 0.003f;
    const int t = 3;
    const double bias1 = 1.0 - std::pow(0.9, t), bias2s = std::sqrt(1.0 - std::pow(0.999, t));
    const float step_size = (float)(lr / bias1), inv_b2 = (float)(1.0 / bias2s);
    struct Tensor { std::vector<float> p, g, m, v; };
    std::vector<Tensor> a(lens.size());
    for (size_t k = 0; k < lens.size(); ++k) {
        a[k].p.resize(lens[k]); a[k].g.resize(lens[k]); a[k].m.resize(lens[k]); a[k].v.resize(lens[k]);
        for (auto& x : a[k].p) x = rnd();
        for (auto& x : a[k].g) x = rnd();
        for (auto& x : a[k].m) x = 0.1f * rnd();
        for (auto& x : a[k].v) x = 0.01f * std::fabs(rnd());
    }
    auto b = a, c = a, ref = a;
    // one adam_step per tensor
    for (size_t k = 0; k < lens.size(); ++k)
        launch(adam_step, tgrid(lens[k]), T, b[k].p.data(), (const float*)b[k].g.data(), b[k].m.data(), b[k].v.data(), lens[k], b1, b2, 1 - b1, 1 - b2, eps, wd, step_size, inv_b2);
    // one adam_multi over all of them
    auto table_of = [&](std::vector<Tensor>& ts) {
        std::vector<u64> tab(5 * ts.size() + 1);
        u64 off = 0;
        for (size_t k = 0; k < ts.size(); ++k) {
            tab[4 * k] = (u64)ts[k].p.data(); tab[4 * k + 1] = (u64)ts[k].g.data();
            tab[4 * k + 2] = (u64)ts[k].m.data(); tab[4 * k + 3] = (u64)ts[k].v.data();
            tab[4 * ts.size() + k] = off; off += lens[k];
        }
        tab[5 * ts.size()] = off;
        return tab;
    };
    auto tab = table_of(c);
    const u64 total = tab.back();
    u32 guard = 0;
    launch(adam_multi, tgrid(total), T, (const u64*)tab.data(), (u32)lens.size(), total, (const u32*)&guard, b1, b2, 1 - b1, 1 - b2, eps, wd, step_size, inv_b2);
    bool same = true, close_ref = true;
    for (size_t k = 0; k < lens.size(); ++k) {
        for (u64 i = 0; i < lens[k]; ++i) {
            same &= std::bit_cast<u32>(b[k].p[i]) == std::bit_cast<u32>(c[k].p[i]) && b[k].m[i] == c[k].m[i] && b[k].v[i] == c[k].v[i];
            double g = (double)ref[k].g[i] + wd * (double)ref[k].p[i];
            double m = b1 * (double)ref[k].m[i] + (1 - b1) * g, v = b2 * (double)ref[k].v[i] + (1 - b2) * g * g;
            double p = ref[k].p[i] - (lr / bias1) * m / (std::sqrt(v) / bias2s + eps);
            close_ref &= std::fabs(c[k].p[i] - p) <= 1e-6 * std::max(1.0, std::fabs(p)) && std::fabs(c[k].m[i] - m) <= 1e-6 && std::fabs(c[k].v[i] - v) <= 1e-6;
        }
    }
    CHECK(same, "adam_multi differs from adam_step per tensor");
    CHECK(close_ref, "adam_multi differs from the double reference");
    // A null guard updates; a set guard does not.
    auto d = a; auto tab_d = table_of(d);
    launch(adam_multi, tgrid(total), T, (const u64*)tab_d.data(), (u32)lens.size(), total, (const u32*)nullptr, b1, b2, 1 - b1, 1 - b2, eps, wd, step_size, inv_b2);
    bool moved = true; for (size_t k = 0; k < lens.size(); ++k) moved &= d[k].p == c[k].p;
    CHECK(moved, "adam_multi with a null guard");
    auto e = a; auto tab_e = table_of(e); guard = 1;
    launch(adam_multi, tgrid(total), T, (const u64*)tab_e.data(), (u32)lens.size(), total, (const u32*)&guard, b1, b2, 1 - b1, 1 - b2, eps, wd, step_size, inv_b2);
    bool still = true; for (size_t k = 0; k < lens.size(); ++k) still &= e[k].p == a[k].p && e[k].m == a[k].m && e[k].v == a[k].v;
    CHECK(still, "adam_multi updated under a set guard");
    std::printf("adam ok\n");
}

// pair_dot, pair_hadamard and their backwards (atomics) against double references;
// a bad id is skipped and reported.
static void test_pairs() {
    for (auto [rows, dim, n] : std::vector<std::tuple<u64, u64, u64>>{{1, 1, 1}, {13, 3, 29}, {37, 17, 101}, {64, 33, 70}}) {
        std::vector<float> h(rows * dim), g(n), gz(n * dim), start(rows * dim);
        for (auto& v : h) v = rnd();
        for (auto& v : g) v = rnd();
        for (auto& v : gz) v = rnd();
        for (auto& v : start) v = rnd();
        std::vector<u32> src(n), dst(n), fault(8, 0);
        for (u64 p = 0; p < n; ++p) { src[p] = below(rows); dst[p] = below(rows); }
        dst[0] = src[0];  // a row with itself
        std::vector<float> dot(n, NAN), had(n * dim, NAN), dh = start, dhz = start;
        launch(pair_dot, wgrid(n), T, (const float*)h.data(), rows, dim, (const u32*)src.data(), (const u32*)dst.data(), n, dot.data(), fault.data());
        launch(pair_hadamard, wgrid(n), T, (const float*)h.data(), rows, dim, (const u32*)src.data(), (const u32*)dst.data(), n, had.data(), fault.data());
        launch(pair_dot_backward, wgrid(n), T, (const float*)h.data(), rows, dim, (const u32*)src.data(), (const u32*)dst.data(), n, (const float*)g.data(), dh.data(), fault.data());
        launch(pair_hadamard_backward, wgrid(n), T, (const float*)h.data(), rows, dim, (const u32*)src.data(), (const u32*)dst.data(), n, (const float*)gz.data(), dhz.data(), fault.data());
        std::vector<double> wdh(start.begin(), start.end()), wdz(start.begin(), start.end());
        bool ok = fault[0] == 0;
        for (u64 p = 0; p < n; ++p) {
            const u64 s = src[p] * dim, d = dst[p] * dim;
            double acc = 0;
            for (u64 c = 0; c < dim; ++c) {
                acc += (double)h[s + c] * h[d + c];
                ok &= close(had[p * dim + c], (double)h[s + c] * h[d + c], 1e-6);
                wdh[s + c] += (double)g[p] * h[d + c];
                wdh[d + c] += (double)g[p] * h[s + c];
                wdz[s + c] += (double)gz[p * dim + c] * h[d + c];
                wdz[d + c] += (double)gz[p * dim + c] * h[s + c];
            }
            ok &= close(dot[p], acc, 1e-5);
        }
        for (u64 k = 0; k < rows * dim; ++k) ok &= close(dh[k], wdh[k], 1e-5) && close(dhz[k], wdz[k], 1e-5);
        CHECK(ok, "pair ops rows %llu dim %llu pairs %llu", rows, dim, n);
        // An id past the rows: its output is 0, the fault names it and the bound.
        src[n - 1] = (u32)rows;
        launch(pair_dot, wgrid(n), T, (const float*)h.data(), rows, dim, (const u32*)src.data(), (const u32*)dst.data(), n, dot.data(), fault.data());
        CHECK(fault[0] == FAULT_PAIR_INDEX && fault[1] == rows && fault[3] == rows && dot[n - 1] == 0.0f, "pair fault");
    }
    std::printf("pairs ok\n");
}

// bce_rows, summed by xent_reduce: loss, count and gradient against double
// references; stable at +-1e4; a NaN sets the guard.
static void test_bce() {
    for (u64 n : {1ull, 7ull, 333ull, 1025ull}) {
        std::vector<float> x(n), y(n), g(n, NAN), rl(n);
        std::vector<u32> rc(n);
        for (u64 i = 0; i < n; ++i) { x[i] = 12 * rnd(); y[i] = (float)below(2); }
        if (n > 2) { x[0] = 1e4f; y[0] = 0; x[1] = -1e4f; y[1] = 1; }
        launch(bce_rows, tgrid(n), T, (const float*)x.data(), (const float*)y.data(), n, g.data(), 1u, (float)(1.0 / n), rl.data(), rc.data());
        double wl = 0; u64 wc = 0; bool gok = true;
        for (u64 i = 0; i < n; ++i) {
            const double a = x[i], b = y[i];
            wl += std::max(a, 0.0) - a * b + std::log1p(std::exp(-std::fabs(a)));
            wc += (a > 0) == (b > 0.5);
            gok &= std::fabs(g[i] - (1.0 / (1.0 + std::exp(-a)) - b) / n) <= 1e-6;
        }
        double loss = 0; u64 corr = 0; u32 guard = 0;
        launch(xent_reduce, 1, 256, (const float*)rl.data(), (const u32*)rc.data(), n, &loss, &corr, &guard);
        CHECK(close(loss / n, wl / n, 1e-6) && corr == wc && guard == 0 && gok, "bce n=%llu loss %g vs %g correct %llu vs %llu", n, loss / n, wl / n, corr, wc);
        x[n / 2] = NAN;
        launch(bce_rows, tgrid(n), T, (const float*)x.data(), (const float*)y.data(), n, (float*)nullptr, 0u, (float)(1.0 / n), rl.data(), rc.data());
        launch(xent_reduce, 1, 256, (const float*)rl.data(), (const u32*)rc.data(), n, &loss, &corr, &guard);
        CHECK(guard == 1, "bce guard not set by a NaN logit");
    }
    std::printf("bce ok\n");
}

// The counter-based generator is cpu_ops::rng's bit for bit (the numbers its
// test pins), and negative_draw is the module doc's draw, uniform and by a
// cumulative table (a weight-0 vertex never drawn).
static void test_negatives() {
    const u64 key = hash_key(42, 7);
    CHECK(key == 0x5864fa25fd883a8aull && hash_draw(key, 0) == 0x9c25c36dc45de5fcull && hash_draw(key, 999) == 0x39c9ac055eb12e6eull, "generator drifted from cpu_ops::rng");
    CHECK(uniform_below(~0ull, 10) == 9 && uniform_below(1ull << 63, 7) == 3, "uniform_below");
    for (u64 nv : {1ull, 1001ull}) {
        std::vector<u64> cdf(nv + 1, 0);
        // Small weights: draws land on the table's boundaries (cdf[v] == r) often.
        for (u64 v = 0; v < nv; ++v) cdf[v + 1] = cdf[v] + (v % 7 == 3 ? 0 : 1 + below(3));
        for (auto [n_pos, k] : std::vector<std::pair<u64, u64>>{{1, 1}, {37, 3}, {500, 5}}) {
            std::vector<u32> src(n_pos);
            for (auto& s : src) s = below(nv);
            for (u32 has : {0u, 1u}) {
                const u64 total = n_pos * k, kk = hash_key(77, 0x6e65676174697665ull);
                std::vector<u32> os(total + 1, 0xabcd), od(total + 1, 0xabcd);
                launch(negative_draw, tgrid(total), T, (const u32*)src.data(), n_pos, k, kk, nv, (const u64*)cdf.data(), has, os.data(), od.data());
                bool ok = os[total] == 0xabcd && od[total] == 0xabcd;
                for (u64 t = 0; t < total; ++t) {
                    const u64 bits = hash_draw(kk, t);
                    u64 want = uniform_below(bits, nv);
                    if (has) {
                        const u64 r = uniform_below(bits, cdf[nv]);
                        want = 0;
                        while (!(cdf[want] <= r && r < cdf[want + 1])) ++want;
                        ok &= want % 7 != 3;
                    }
                    ok &= os[t] == src[t / k] && od[t] == want;
                }
                CHECK(ok, "negative_draw %llu vertices %llu x %llu table %u", nv, n_pos, k, has);
            }
        }
    }
    std::printf("negatives ok\n");
}

// exclude_flag, a scan of the flags, exclude_compact against a set-based
// reference; the last shape's flags span several scan tiles.
static void test_exclude() {
    for (auto [nd, ns, deg] : std::vector<std::tuple<u64, u64, u64>>{{1, 1, 1}, {37, 91, 7}, {203, 517, 9}, {5000, 9000, 8}}) {
        Csr c = random_block(nd, ns, deg);
        const u64 ne = c.idx.size();
        std::vector<u32> ids(4 * ns);
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(ns);
        std::vector<u64> keys;
        auto key = [](u32 d, u32 s) { return ((u64)d << 32) | s; };
        for (u64 i = 0; i < nd; ++i)
            for (u64 e = c.indptr[i]; e < c.indptr[i + 1]; e += 3) { keys.push_back(key(ids[i], ids[c.idx[e]])); keys.push_back(key(ids[c.idx[e]], ids[i])); }
        for (int r = 0; r < 9; ++r) keys.push_back(key(below(1 << 20), below(1 << 20)));
        std::sort(keys.begin(), keys.end());
        keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
        std::vector<u64> wp{0}; std::vector<u32> wi;
        for (u64 i = 0; i < nd; ++i) {
            for (u64 e = c.indptr[i]; e < c.indptr[i + 1]; ++e)
                if (!std::binary_search(keys.begin(), keys.end(), key(ids[i], ids[c.idx[e]]))) wi.push_back(c.idx[e]);
            wp.push_back(wi.size());
        }
        std::vector<u32> pos(ne + 1, 0xdead);
        pos[ne] = 0;
        launch(exclude_flag, wgrid(nd), T, (const u64*)c.indptr.data(), (const u32*)c.idx.data(), nd, (const u32*)ids.data(), (const u64*)keys.data(), (u64)keys.size(), pos.data());
        scan_in_place<u32>(pos, ne + 1);
        const u64 kept = pos[ne];
        std::vector<u64> np(nd + 1, 77);
        std::vector<u32> ni(kept + 1, 0xabcd);
        launch(exclude_compact, tgrid(std::max<u64>(ne, nd + 1)), T, (const u64*)c.indptr.data(), (const u32*)c.idx.data(), nd, ne, (const u32*)pos.data(), np.data(), ni.data());
        CHECK(kept == wi.size() && np == wp && std::equal(wi.begin(), wi.end(), ni.begin()) && ni[kept] == 0xabcd, "exclude %llu x %llu: kept %llu of %llu (want %zu)", nd, ns, kept, ne, wi.size());
    }
    std::printf("exclude ok\n");
}

int main() {
    test_scan();
    test_relabel();
    test_aggregate();
    test_gat();
    test_xent();
    test_sample();
    test_count_scan();
    test_sample_chain();
    test_gather_and_rows();
    test_gather_bf16();
    test_math();
    test_adam();
    test_pairs();
    test_bce();
    test_negatives();
    test_exclude();
    std::printf("%s (%d failures)\n", failures ? "FAILED" : "ALL OK", failures);
    return failures != 0;
}
