#include "slope/parallel/data_plane.h"

namespace slope::parallel {

DataPlaneFactory host_data_plane() {
  return [](Communicator& comm) -> std::unique_ptr<DataPlane> { return std::make_unique<HostDataPlane>(comm); };
}

}  // namespace slope::parallel
