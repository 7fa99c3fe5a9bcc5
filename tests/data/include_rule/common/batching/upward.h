// A fixture of the dependency_rule test: an upward include that the rule refuses.
#include "common/nn/target_model.h"
