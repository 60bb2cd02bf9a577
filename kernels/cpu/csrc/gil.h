// WithoutGil: let the Python GIL go for a scope, when the caller holds it (an op called from Python).
// A whole model step (decoder.cpp) runs for milliseconds; holding the GIL through it would stall the
// serving event loop in the same process (docs/design.md, "Threads and the GIL"). Built without
// Python's headers (kernels/cpu/library.py), it does nothing.
#pragma once
#if defined(MSTAR_RELEASE_GIL)
#include <Python.h>
#endif

namespace mstar_cpu {

class WithoutGil {
 public:
  WithoutGil() {
#if defined(MSTAR_RELEASE_GIL)
    if (Py_IsInitialized() && PyGILState_Check()) state_ = PyEval_SaveThread();
#endif
  }
  ~WithoutGil() {
#if defined(MSTAR_RELEASE_GIL)
    if (state_ != nullptr) PyEval_RestoreThread(state_);
#endif
  }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  #if defined(MSTAR_RELEASE_GIL)
  PyThreadState* state_ = nullptr;
#endif
};

}  // namespace mstar_cpu
