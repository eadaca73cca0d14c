// The worker pool: host threads that run the items of one `parallel_for` at a time.

#include "pool.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace cuemu {

namespace {

/// Host threads that run the items of one `parallel_for` at a time; `run` returns
/// when every worker has finished with the generation it started.
struct Pool {
    std::mutex mutex;
    std::condition_variable start, done;
    const std::function<void(size_t)>* body = nullptr;
    size_t n = 0;
    std::atomic<size_t> next{0};
    unsigned pending = 0;  // workers not yet finished with this generation
    uint64_t generation = 0;
    std::vector<std::thread> threads;

    explicit Pool(unsigned count) {
        for (unsigned i = 1; i < count; i++) {
            threads.emplace_back([this] { serve(); });
            threads.back().detach();
        }
    }

    void drain(const std::function<void(size_t)>& f, size_t count) {
        for (size_t i; (i = next.fetch_add(1)) < count;) {
            f(i);
        }
    }

    void serve() {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lock(mutex);
        for (;;) {
            start.wait(lock, [&] { return generation != seen; });
            seen = generation;
            const auto* f = body;
            size_t count = n;
            lock.unlock();
            drain(*f, count);
            lock.lock();
            if (--pending == 0) {
                done.notify_all();
            }
        }
    }

    void run(size_t count, const std::function<void(size_t)>& f) {
        if (threads.empty() || count <= 1) {
            for (size_t i = 0; i < count; i++) f(i);
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mutex);
            body = &f;
            n = count;
            next = 0;
            pending = unsigned(threads.size());
            generation++;
        }
        start.notify_all();
        drain(f, count);
        std::unique_lock<std::mutex> lock(mutex);
        done.wait(lock, [&] { return pending == 0; });
    }
};

Pool& pool() {
    static Pool* p = new Pool(workers());
    return *p;
}

}  // namespace

unsigned workers() {
    static unsigned n = [] {
        const char* env = std::getenv("CUDA_EMU_THREADS");
        int v = env ? std::atoi(env) : int(std::thread::hardware_concurrency());
        return unsigned(v > 0 ? v : 1);
    }();
    return n;
}

void parallel_for(size_t n, const std::function<void(size_t)>& body) { pool().run(n, body); }

}  // namespace cuemu
