// A fixture of the dependency_rule test: one service including another.
#include "services/coordinator/coordinator.h"
