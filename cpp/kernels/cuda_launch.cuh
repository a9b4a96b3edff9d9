// What lucebox's CUDA kernels share about launching: cached device attributes and programmatic
// dependent launches (PDL) as ggml's CUDA backend uses them (and, at the end, the 16-byte cp.async
// copies that q8_0_matmul.cuh and gdn_prefill.cuh stage their inputs with). A kernel launched with PDL may start
// while the stream's previous kernel still runs; it must `griddepcontrol.wait` before it reads
// that kernel's results (and read them with coherent loads, never through restrict-qualified
// const pointers), and may `griddepcontrol.launch_dependents` to let the next one start early.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

namespace lucebox::kernels::cuda {

// Attribute ATTR of device dev (0 if the driver cannot say), asked once per device.
template <cudaDeviceAttr ATTR>
int device_attribute(int dev) {
    static int known[64] = {};  // value + 1; 0: not asked yet
    if (dev < 0 || dev >= 64) return 0;
    int k = __atomic_load_n(&known[dev], __ATOMIC_ACQUIRE);
    if (k == 0) {
        int v = 0;
        k = 1 + (cudaDeviceGetAttribute(&v, ATTR, dev) == cudaSuccess ? v : 0);
        __atomic_store_n(&known[dev], k, __ATOMIC_RELEASE);
    }
    return k - 1;
}

// The compute capability major of device dev.
inline int device_major(int dev) { return device_attribute<cudaDevAttrComputeCapabilityMajor>(dev); }

// The opt-in shared memory per block of device dev (bytes).
inline int device_smem_optin(int dev) { return device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(dev); }

// Whether ggml's own switch GGML_CUDA_PDL=0 turns programmatic dependent launches off: its kernels'
// and then these (bench/bench_kernels.py --no-pdl: kernel times without the overlap). Read once.
inline bool pdl_off_by_env() {
    static const bool off = [] {
        const char * env = std::getenv("GGML_CUDA_PDL");
        return env != nullptr && std::atoi(env) == 0;
    }();
    return off;
}

// Whether this device runs programmatic dependent launches (compute capability >= 9.0, and not
// GGML_CUDA_PDL=0).
inline bool pdl_device(int dev) { return device_major(dev) >= 9 && !pdl_off_by_env(); }

// Whether `Kernel` runs on device dev code compiled for compute capability >= V (the PTX version of
// the image the device loads: SASS built from it, or PTX JIT-compiled), not code from older PTX
// (which the kernel may compile to a stub where it needs newer instructions). False where the
// device has no image of the kernel. Asked once per kernel and device.
template <auto Kernel, int V>
bool code_at_least(int dev) {
    static int known[64] = {};  // this kernel, per device: 0 not asked yet, 1 yes, -1 no
    if (dev < 0 || dev >= 64) return false;
    int k = __atomic_load_n(&known[dev], __ATOMIC_ACQUIRE);
    if (k == 0) {
        cudaFuncAttributes fa = {};
        const cudaError_t e = cudaFuncGetAttributes(&fa, Kernel);
        if (e != cudaSuccess) (void) cudaGetLastError();  // (no image for this device: not left for a later check)
        k = e == cudaSuccess && fa.ptxVersion >= V ? 1 : -1;
        __atomic_store_n(&known[dev], k, __ATOMIC_RELEASE);
    }
    return k == 1;
}

// Whether `kernel` runs code compiled for compute capability >= 9.0 on device dev (>= 9.0), not
// code JIT-compiled from older PTX, which has no griddepcontrol (it would read its inputs too early)
// and no cluster instructions.
template <auto Kernel>
bool sm90_code(int dev) {
    return device_major(dev) >= 9 && code_at_least<Kernel, 90>(dev);
}

// Whether `kernel` launches with PDL on this device.
template <auto Kernel>
bool pdl_kernel(int dev) { return pdl_device(dev) && sm90_code<Kernel>(dev); }

// Whether `kernel` launches in thread-block clusters on this device.
template <auto Kernel>
bool clusters_run(int dev) { return sm90_code<Kernel>(dev); }

// How many CTAs of `Kernel` (blocks of `block` threads with `smem` bytes of dynamic shared memory)
// fit on one multiprocessor of device dev at once; 0 where the runtime cannot say. Asked once per
// device: a kernel's launches must all pass the same block and smem.
template <auto Kernel>
int resident_ctas(int dev, int block, int smem) {
    static int known[64] = {};  // the residency + 1 per device; 0: not asked yet
    if (dev < 0 || dev >= 64) return 0;
    int k = __atomic_load_n(&known[dev], __ATOMIC_ACQUIRE);
    if (k == 0) {
        int resident = 0;
        k = 1 + (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, Kernel, block, size_t(smem)) == cudaSuccess ? resident : 0);
        __atomic_store_n(&known[dev], k, __ATOMIC_RELEASE);
    }
    return k - 1;
}

// The dynamic shared memory to give each CTA of a `grid`-CTA launch of `Kernel` (blocks of `block`
// threads needing `smem` bytes) so that its CTAs spread over all multiprocessors: a grid that fits
// in one wave of resident CTAs, r = ceil(grid / SMs) < the kernel's residency, is given the most
// shared memory with which only r CTAs fit on one multiprocessor (the CTA scheduler otherwise may
// fill some multiprocessors up to the residency and leave others idle). `smem` itself where no
// padding applies. The kernel's dynamic shared memory limit must allow device_smem_optin(dev) bytes.
template <auto Kernel>
int spread_smem(int dev, int grid, int block, int smem) {
    const int resident = resident_ctas<Kernel>(dev, block, smem), sms = device_attribute<cudaDevAttrMultiProcessorCount>(dev);
    const int per_sm = device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(dev);
    const int reserved = device_attribute<cudaDevAttrReservedSharedMemoryPerBlock>(dev);
    if (resident <= 0 || sms <= 0 || per_sm <= 0) return smem;
    const int r = (grid + sms - 1) / sms;
    if (r >= resident) return smem;
    // (a CTA's shared memory, its reserved share included, is allocated in units of 128 bytes)
    const int padded = per_sm / r / 128 * 128 - reserved, optin = device_smem_optin(dev);
    return padded > smem ? (padded < optin ? padded : optin) : smem;
}

// A launch of `kernel` on stream, as a programmatic dependent of the stream's previous kernel when
// `pdl` (the kernel then waits for it with griddepcontrol.wait before reading its results).
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                   Args &&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1] = {};
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    if (pdl) {
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// A launch of `kernel` in clusters of cluster_x consecutive CTAs (grid.x a multiple of it, no dynamic
// shared memory), a programmatic dependent of the stream's previous kernel when `pdl`.
template <typename... Params, typename... Args>
cudaError_t launch_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, unsigned cluster_x,
                               cudaStream_t stream, bool pdl, Args &&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2] = {};
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster_x;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 2 : 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// In a kernel launched in clusters: a barrier of the cluster's threads (their shared-memory writes
// before it are visible to the cluster after it), and the address of `p` (a __shared__ variable)
// in the CTA of cluster rank r.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
template <typename T>
__device__ __forceinline__ T * cluster_shared(T * p, int r) {
    uint64_t out = 0;
    asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(reinterpret_cast<uint64_t>(p)), "r"(r));
    return reinterpret_cast<T *>(out);
}
#endif

// In a kernel launched with PDL: let the next kernel launch / wait for the previous one's results
// (no-ops where not launched so, and in code for compute capability < 9.0).
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// 16 bytes global -> shared, asynchronously (cp.async.cg: through L2 only; compute capability >= 8.0);
// src_bytes < 16 reads that many and fills the rest with zeros (0: reads nothing). Both addresses
// 16-byte aligned. The copies a thread issued since its last cp_async_commit form one group;
// cp_async_wait<N> waits until at most N of its groups are still in flight (then a barrier makes
// the data visible to other threads).
__device__ __forceinline__ void cp_async16(void * smem_dst, const void * global_src, int src_bytes = 16) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(global_src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

}  // namespace lucebox::kernels::cuda
