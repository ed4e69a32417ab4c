// The canary's positive control: a small two-stage all-reduce of aiter's protocol
// (cross_device_reduce_2stage of custom_all_reduce.cuh at e4048607a5), written anew.
//
// Each rank owns one device buffer: [Signal | tmp | input]. The buffers are shared over the CUDA
// runtime's IPC handles (hipIpc* after torch's hipify on ROCm). One call: copy the input into this
// rank's input region; start_sync (per-block flags: every block writes its flag into every peer's
// Signal and waits for theirs); stage 1 reduces this rank's segment of the packs from every peer's
// input (the loop stages the packs through shared memory with a barrier in it, one slot of
// THREADS / ngpus lanes per peer) into this rank's tmp; end_sync; stage 2 gathers every rank's
// reduced segment from its tmp, thread for thread with stage 1.
//
// MILES_AMD_CONTROL_BROKEN builds the same kernel without end_sync's wait: a block still signals
// its peers but reads their tmp at once, so it can see a segment of the previous call (stale) or
// of the next one. That is the fault class of ROCm/aiter#5694 (stage 2 before the peers' stage 1).
//
// Plain C++ and the CUDA runtime API only (volatile flags, __threadfence_system), no inline PTX:
// torch's hipify turns it into HIP unchanged. bf16 is handled as raw bits (no bf16 headers).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr int kMaxBlocks = 80;
constexpr int kThreads = 512;
constexpr int kMaxRanks = 8;
#ifdef MILES_AMD_CONTROL_BROKEN
constexpr bool kBroken = true;
#else
constexpr bool kBroken = false;
#endif

struct Signal {
  alignas(128) uint32_t start[kMaxBlocks][kMaxRanks];
  alignas(128) uint32_t end[kMaxBlocks][kMaxRanks];
  alignas(128) uint32_t flag[kMaxBlocks];
};

struct Peers {
  Signal* signals[kMaxRanks];
  const uint4* inputs[kMaxRanks];
  uint4* tmps[kMaxRanks];
};

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

__device__ __forceinline__ uint32_t load_flag(const uint32_t* p) {
  return *reinterpret_cast<const volatile uint32_t*>(p);
}

__device__ __forceinline__ void store_flag(uint32_t* p, uint32_t v) {
  *reinterpret_cast<volatile uint32_t*>(p) = v;
}

template <int ngpus>
__device__ void start_sync(const Peers& peers, Signal* self, int rank) {
  uint32_t flag = self->flag[blockIdx.x] + 1;
  if (threadIdx.x < ngpus) {
    store_flag(&peers.signals[threadIdx.x]->start[blockIdx.x][rank], flag);
    while (load_flag(&self->start[blockIdx.x][threadIdx.x]) < flag) {
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) self->flag[blockIdx.x] = flag;
}

template <int ngpus, bool broken>
__device__ void end_sync(const Peers& peers, Signal* self, int rank) {
  __syncthreads();
  __threadfence_system();  // this block's tmp writes before its flag
  uint32_t flag = self->flag[blockIdx.x] + 1;
  if (threadIdx.x < ngpus) {
    store_flag(&peers.signals[threadIdx.x]->end[blockIdx.x][rank], flag);
    if (!broken) {
      while (load_flag(&self->end[blockIdx.x][threadIdx.x]) < flag) {
      }
      __threadfence_system();  // the peers' tmp writes after their flags
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) self->flag[blockIdx.x] = flag;
}

// Element-wise sum of 16-byte packs: float32 (4 lanes) or bf16 bits (8 lanes), in fp32.
template <bool bf16>
__device__ __forceinline__ void add_pack(float* acc, const uint4& p) {
  const uint32_t w[4] = {p.x, p.y, p.z, p.w};
  for (int i = 0; i < 4; ++i) {
    if (bf16) {
      acc[2 * i] += __uint_as_float(w[i] << 16);
      acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
    } else {
      acc[i] += __uint_as_float(w[i]);
    }
  }
}

__device__ __forceinline__ uint32_t to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even (finite inputs)
}

template <bool bf16>
__device__ __forceinline__ uint4 pack(const float* acc) {
  uint32_t w[4];
  for (int i = 0; i < 4; ++i) {
    w[i] = bf16 ? (to_bf16_bits(acc[2 * i]) | (to_bf16_bits(acc[2 * i + 1]) << 16))
                : __float_as_uint(acc[i]);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Packs [0, size) split in ngpus segments: segment t starts at t * part; the last one also takes
// the remainder. Loops run a block-uniform trip count (guards inside), so every barrier in them
// is met by every thread: the correct build has no trip-count fault of its own.
template <bool bf16, int ngpus, bool broken>
__global__ void __launch_bounds__(kThreads, 1)
    two_stage(Peers peers, Signal* self, uint4* __restrict__ result, int rank, int size) {
  constexpr int slot = kThreads / ngpus;  // lanes per peer in stage 1, per rank in stage 2
  constexpr int lanes = bf16 ? 8 : 4;
  __shared__ uint4 staged[kThreads];
  const int peer_slot = threadIdx.x / slot;
  const int lane = threadIdx.x % slot;
  const int tid = blockIdx.x * slot + lane;
  const int stride = gridDim.x * slot;
  const int part = size / ngpus;
  const int start = rank * part;
  const int end = rank == ngpus - 1 ? size : start + part;
  const int largest = part + size % ngpus;
  const uint4* ins[ngpus];
  uint4* tmps[ngpus];
  for (int i = 0; i < ngpus; ++i) {
    const int target = (rank + i) % ngpus;
    ins[i] = peers.inputs[target];
    tmps[i] = peers.tmps[target];
  }
  start_sync<ngpus>(peers, self, rank);
  // stage 1: reduce-scatter, this rank's segment into its tmp
  for (int base = start + blockIdx.x * slot; base < end; base += stride) {
    const int idx = base + lane;
    if (idx < end) staged[threadIdx.x] = ins[peer_slot][idx];
    __syncthreads();
    if (peer_slot == 0 && idx < end) {
      float acc[lanes] = {};
      for (int i = 0; i < ngpus; ++i) add_pack<bf16>(acc, staged[i * slot + lane]);
      tmps[0][idx - start] = pack<bf16>(acc);
    }
    __syncthreads();
  }
  end_sync<ngpus, broken>(peers, self, rank);
  // stage 2: all-gather; slot w reads rank (rank + w)'s segment at the indices it reduced
  const int owner = (rank + peer_slot) % ngpus;
  const int owned = owner == ngpus - 1 ? size - owner * part : part;
  for (int idx = tid; idx < largest; idx += stride) {
    if (idx < owned) result[owner * part + idx] = tmps[peer_slot][idx];
  }
}

class Control {
 public:
  Control(int64_t rank, int64_t world, int64_t max_bytes)
      : rank_(rank), world_(world), max_bytes_(max_bytes) {
    if (world != 2 && world != 4 && world != 8) throw std::runtime_error("world must be 2, 4 or 8");
    if (rank < 0 || rank >= world) throw std::runtime_error("rank out of range");
    check(cudaGetDevice(&device_), "cudaGetDevice");
#ifdef USE_ROCM
    // aiter's meta buffer is uncached so that peers see flags and tmp during the kernel.
    check(hipExtMallocWithFlags(reinterpret_cast<void**>(&base_), region_bytes(),
                                hipDeviceMallocUncached),
          "hipExtMallocWithFlags");
#else
    check(cudaMalloc(&base_, region_bytes()), "cudaMalloc");
#endif
    check(cudaMemset(base_, 0, sizeof(Signal)), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  ~Control() {
    for (int r = 0; r < world_; ++r) {
      if (r != rank_ && opened_[r] != nullptr) cudaIpcCloseMemHandle(opened_[r]);
    }
    if (base_ != nullptr) cudaFree(base_);
  }

  torch::Tensor handle() const {
    cudaIpcMemHandle_t h;
    check(cudaIpcGetMemHandle(&h, base_), "cudaIpcGetMemHandle");
    auto out = torch::empty({static_cast<int64_t>(sizeof(h))}, torch::kUInt8);
    std::memcpy(out.data_ptr(), &h, sizeof(h));
    return out;
  }

  void open(const std::vector<torch::Tensor>& handles) {
    if (static_cast<int64_t>(handles.size()) != world_) {
      throw std::runtime_error("one handle a rank");
    }
    for (int r = 0; r < world_; ++r) {
      char* p = base_;
      if (r != rank_) {
        cudaIpcMemHandle_t h;
        std::memcpy(&h, handles[r].data_ptr(), sizeof(h));
        void* mapped = nullptr;
        check(cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess),
              "cudaIpcOpenMemHandle");
        opened_[r] = mapped;
        p = static_cast<char*>(mapped);
      }
      peers_.signals[r] = reinterpret_cast<Signal*>(p);
      peers_.tmps[r] = reinterpret_cast<uint4*>(p + tmp_offset());
      peers_.inputs[r] = reinterpret_cast<const uint4*>(p + input_offset());
    }
  }

  torch::Tensor all_reduce(const torch::Tensor& input) {
    const int64_t bytes = input.numel() * input.element_size();
    if (!input.is_cuda() || !input.is_contiguous()) {
      throw std::runtime_error("contiguous cuda input");
    }
    if (bytes > max_bytes_ || bytes % 16 != 0) throw std::runtime_error("size not served");
    const bool bf16 = input.scalar_type() == at::kBFloat16;
    if (!bf16 && input.scalar_type() != at::kFloat) throw std::runtime_error("float32 or bf16");
    const at::cuda::OptionalCUDAGuard guard(device_of(input));
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    auto out = torch::empty_like(input);
    check(cudaMemcpyAsync(base_ + input_offset(), input.data_ptr(), bytes,
                          cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
    const int size = static_cast<int>(bytes / 16);
    const int slot = kThreads / world_;
    int blocks = (size / world_ + slot - 1) / slot;
    blocks = blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks);
    auto* self = reinterpret_cast<Signal*>(base_);
    auto* result = reinterpret_cast<uint4*>(out.data_ptr());
    if (world_ == 2) {
      launch<2>(bf16, blocks, stream, self, result, size);
    } else if (world_ == 4) {
      launch<4>(bf16, blocks, stream, self, result, size);
    } else {
      launch<8>(bf16, blocks, stream, self, result, size);
    }
    check(cudaGetLastError(), "two_stage launch");
    return out;
  }

 private:
  template <int ngpus>
  void launch(bool bf16, int blocks, cudaStream_t stream, Signal* self, uint4* result, int size) {
    const int rank = static_cast<int>(rank_);
    if (bf16) {
      two_stage<true, ngpus, kBroken><<<blocks, kThreads, 0, stream>>>(peers_, self, result, rank,
                                                                         size);
    } else {
      two_stage<false, ngpus, kBroken><<<blocks, kThreads, 0, stream>>>(peers_, self, result,
                                                                          rank, size);
    }
  }

  int64_t tmp_offset() const { return (sizeof(Signal) + 255) / 256 * 256; }
  int64_t input_offset() const { return tmp_offset() + (max_bytes_ + 255) / 256 * 256; }
  int64_t region_bytes() const { return input_offset() + max_bytes_; }

  int64_t rank_, world_, max_bytes_;
  int device_ = 0;
  char* base_ = nullptr;
  void* opened_[kMaxRanks] = {};
  Peers peers_ = {};
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<Control>(m, "Control")
      .def(pybind11::init<int64_t, int64_t, int64_t>())
      .def("handle", &Control::handle)
      .def("open", &Control::open)
      .def("all_reduce", &Control::all_reduce);
}
